"""PySpark over a twistmq store: the ``twistmq`` data source and the device-stream jobs.

``from spark.datasource import TwistmqDataSource`` and register it with
``spark.dataSource.register(TwistmqDataSource)``; the jobs live in
``spark.jobs`` and the telemetry simulator in ``spark.simulator``.
"""
