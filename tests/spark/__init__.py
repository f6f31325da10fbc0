"""Tests of the Spark data source, jobs, report and simulator."""
