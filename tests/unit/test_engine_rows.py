"""Unit tests of the native/timer/Spark rows of ./dev bench (bench/engine_rows.py): verdicts and the doc section."""

from bench import engine_rows

NATIVE = {"requests": 160_000, "tps": 10_500.0, "avg_ms": 0.74, "p99_ms": 2.0, "server_cpu_us_per_request": 60.0,
          "server_cpu_share": 0.9}
TIMER = {"count": 1_000_000, "delivered": 1_000_000, "p50_ms": 8, "p99_ms": 150, "max_ms": 300}
SPARK = {"messages": 300_000, "source_rows_per_s": 200_000, "parquet_rows_per_s": 300_000,
         "ratio_source_to_parquet": 0.67}


def test_each_row_says_whether_its_target_is_met():
    """A figure past its must-reach is met, its aim judged apart; a failed bench is a row saying so."""
    rows = engine_rows.rows(NATIVE, TIMER, SPARK)
    verdicts = [r[-1] for r in rows]
    assert verdicts == ["met", "met", "", "met", "met"]
    slow = engine_rows.rows({**NATIVE, "tps": 9_000.0, "avg_ms": 0.5}, {**TIMER, "p99_ms": 90},
                            {**SPARK, "ratio_source_to_parquet": 0.9})
    assert [r[-1] for r in slow] == ["missed", "met; aim met", "", "met; aim met", "met; aim met"]
    failed = engine_rows.rows({"error": "boom"}, TIMER, SPARK)
    assert failed[0][-1] == "not run" and "boom" in failed[0][1]


def test_section_replaces_the_previous_one(tmp_path):
    """Writing the section twice leaves one copy, after the broker table, with the rest of the page kept."""
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# twistmq benchmarks\n\n| broker table |\n")
    table = engine_rows.rows(NATIVE, TIMER, SPARK)
    engine_rows.write_section(doc, engine_rows.render(table, "2026-11-23 15:00 UTC", "0.5"))
    engine_rows.write_section(doc, engine_rows.render(table, "2026-11-23 16:00 UTC", "0.7"))
    text = doc.read_text()
    assert text.count(engine_rows.SECTION_START) == 1 and "16:00" in text and "15:00" not in text
    assert text.startswith("# twistmq benchmarks\n\n| broker table |\n")
