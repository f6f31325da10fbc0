"""Tests that keep the documentation true: the README's examples, run as a user would."""
