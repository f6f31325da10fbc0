"""bench.chaos_report: the chaos harness's JSON lines become the docs section that bench.compare keeps."""

import json

from bench import chaos_report, engine_rows

RECORD = {"n": 1, "type": "master-kill", "rto_s": 2.3, "detect_s": 1.6, "elect_s": 1.7, "role_s": 1.72,
          "route_s": 1.71, "first_ack_s": 2.3, "sss_full_s": 6.0, "elections": 1, "lost": 0, "duplicates": 2}
SUMMARY = {"type": "summary", "seed": 1, "rate": 1000.0, "acked": 900, "lost": 0, "duplicates": 2, "elections": 1,
           "max_ack_gap_s": 2.3, "run_s": 20.0}


def test_a_run_renders_one_row_per_fault_type_with_its_losses(tmp_path):
    """Injection lines and the summary (with the harness's text lines between) give a row per type and the total."""
    run = tmp_path / "run.txt"
    run.write_text("chaos: 1 master-kill ...\n" + json.dumps(RECORD) + "\n" + json.dumps(dict(RECORD, n=2, rto_s=2.9))
                   + "\n" + json.dumps(SUMMARY) + "\nfault n rto\n")
    records, summary = chaos_report.read_run(run)
    assert len(records) == 2 and summary["acked"] == 900
    section = chaos_report.render(records, summary, {"acked": 50, "lost": 0, "duplicates": 0, "elections": 0,
                                                     "run_s": 60}, "today")
    assert "| master-kill | 2 | 2.60 / 2.90 |" in section
    assert "**0 lost**" in section and "Fault-free run" in section
    assert section.startswith(chaos_report.SECTION_START) and chaos_report.SECTION_END in section


def test_the_section_survives_a_rewrite_of_the_document(tmp_path):
    """kept_section gives back exactly what was written, so bench.compare can put it back after its rewrite."""
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# twistmq benchmarks\n\nold table\n")
    section = chaos_report.render([RECORD], SUMMARY, None, "today")
    engine_rows.write_section(doc, section, chaos_report.SECTION_START, chaos_report.SECTION_END)
    kept = chaos_report.kept_section(doc)
    doc.write_text("# twistmq benchmarks\n\nnew table\n")
    engine_rows.write_section(doc, kept, chaos_report.SECTION_START, chaos_report.SECTION_END)
    assert "new table" in doc.read_text() and chaos_report.kept_section(doc) == kept
    assert chaos_report.kept_section(tmp_path / "missing.md") is None
