"""Device-stream analysis jobs over the ``twistmq`` data source.

Each job runs as ``./dev python -m spark.jobs.<name> --data-dir DATA_DIR --out OUT``
or through ``./dev spark-submit spark/jobs/<name>.py ...`` (from any directory:
``./dev`` points Spark's driver and workers at the project's interpreter): ``telemetry`` (windowed
statistics per device and metric), ``anomalies`` (rolling z-scores),
``silent`` (devices not heard from), ``talkers`` (top talkers and topic heat)
and ``report`` (all of them, plus an HTML report with charts).
"""
