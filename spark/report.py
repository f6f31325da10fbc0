"""The HTML report: a page a person opens and reads at a glance, with PNG charts.

Takes small pandas tables (the jobs' aggregates, already collected) and writes
``report.html`` next to its charts: message rate over time, each metric over
time with anomalies marked, a top-talkers bar chart and a topic heat map.
Rendering only: no Spark here.
"""

from __future__ import annotations

import datetime as dt
import html
import os
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

MAX_SERIES = 8  # lines per chart: beyond this a chart stops being readable
MAX_TOPICS = 15


@dataclass
class ReportData:
    """Everything the report shows."""

    title: str
    summary: dict  # label -> value, shown as the first table
    rates: pd.DataFrame  # device_rates: device, window_start, messages, rate_per_s
    stats: pd.DataFrame  # telemetry_stats
    anomalies: pd.DataFrame
    silent: pd.DataFrame
    talkers: pd.DataFrame
    heat: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def _save(fig, out_dir: str, name: str) -> str:
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=100)
    plt.close(fig)
    return name


def _time_axis(ax) -> None:
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
    ax.set_xlabel("time (UTC)")
    ax.grid(True, alpha=0.3)


def _naive(series: pd.Series) -> pd.Series:
    s = pd.to_datetime(series)
    return s.dt.tz_convert(None) if getattr(s.dt, "tz", None) is not None else s


def chart_rates(rates: pd.DataFrame, out_dir: str) -> str | None:
    """Messages per second over time: all devices, and the busiest ones."""
    if rates.empty:
        return None
    r = rates.copy()
    r["window_start"] = _naive(r["window_start"])
    total = r.groupby("window_start")["rate_per_s"].sum().sort_index()
    busiest = r.groupby("device")["messages"].sum().nlargest(MAX_SERIES - 1).index
    fig, ax = plt.subplots(figsize=(11, 4))
    ax.plot(total.index, total.values, color="black", linewidth=2.2, label="all devices")
    for device in busiest:
        d = r[r["device"] == device].sort_values("window_start")
        ax.plot(d["window_start"], d["rate_per_s"], linewidth=1, alpha=0.8, label=device)
    ax.set_ylabel("messages / s")
    ax.set_title("Message rate per window")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    _time_axis(ax)
    return _save(fig, out_dir, "rates.png")


def chart_metric(metric: str, stats: pd.DataFrame, anomalies: pd.DataFrame, out_dir: str) -> str:
    """One metric's window mean per device, with anomalous points marked in red."""
    s = stats[stats["metric"] == metric].copy()
    s["window_start"] = _naive(s["window_start"])
    a = anomalies[anomalies["metric"] == metric].copy()
    a["ts"] = _naive(a["ts"]) if not a.empty else a.get("ts")
    flagged = list(dict.fromkeys(a["device"])) if not a.empty else []
    others = [d for d in s.groupby("device")["count"].sum().sort_values(ascending=False).index if d not in flagged]
    devices = (flagged + others)[:MAX_SERIES]
    fig, ax = plt.subplots(figsize=(11, 4))
    for device in devices:
        d = s[s["device"] == device].sort_values("window_start")
        ax.plot(d["window_start"], d["mean"], linewidth=1, label=device)
    if not a.empty:
        ax.scatter(a["ts"], a["value"], color="red", marker="x", s=60, zorder=5,
                   label=f"anomaly ({len(a)})")
    ax.set_ylabel(f"{metric} (window mean; anomalies: raw value)")
    ax.set_title(f"{metric} over time")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    _time_axis(ax)
    return _save(fig, out_dir, f"metric_{_slug(metric)}.png")


def chart_talkers(talkers: pd.DataFrame, out_dir: str) -> str | None:
    """Horizontal bars: messages per device, busiest on top."""
    if talkers.empty:
        return None
    t = talkers.sort_values(["messages", "bytes"], ascending=True)
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.4 * len(t) + 1)))
    bars = ax.barh(t["device"], t["messages"], color="#3b75af")
    ax.bar_label(bars, labels=[f"{m:,}" for m in t["messages"]], padding=3, fontsize=8)
    ax.set_xlabel("messages")
    ax.set_title("Top talkers")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, out_dir, "top_talkers.png")


def chart_heat(heat: pd.DataFrame, out_dir: str) -> str | None:
    """Heat map: messages per topic (rows, busiest first) per window (columns)."""
    if heat.empty:
        return None
    h = heat.copy()
    h["window_start"] = _naive(h["window_start"])
    top = h.groupby("topic")["messages"].sum().nlargest(MAX_TOPICS).index
    grid = (h[h["topic"].isin(top)].pivot_table(index="topic", columns="window_start", values="messages",
                                                 aggfunc="sum", fill_value=0)
            .reindex(top))
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.35 * len(grid) + 1.5)))
    img = ax.imshow(grid.values, aspect="auto", cmap="inferno", interpolation="nearest")
    ax.set_yticks(range(len(grid.index)), labels=list(grid.index), fontsize=8)
    cols = list(grid.columns)
    step = max(1, len(cols) // 12)
    ax.set_xticks(range(0, len(cols), step), labels=[c.strftime("%H:%M") for c in cols[::step]], fontsize=8)
    ax.set_xlabel("window start (UTC)")
    ax.set_title("Topic heat (messages per window)")
    fig.colorbar(img, ax=ax, label="messages")
    return _save(fig, out_dir, "topic_heat.png")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)[:40] or "metric"


def _table(df: pd.DataFrame, limit: int = 50) -> str:
    if df.empty:
        return "<p class='none'>none</p>"
    shown = df.head(limit).copy()
    for col in shown.columns:
        if pd.api.types.is_float_dtype(shown[col]):
            shown[col] = shown[col].map(lambda v: f"{v:,.3f}")
    more = f"<p class='more'>{len(df) - limit} more rows in the Parquet output</p>" if len(df) > limit else ""
    return shown.to_html(index=False, border=0, classes="data", escape=True) + more


CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2em; } .sub { color: #666; margin-top: 0; }
table.data, table.summary { border-collapse: collapse; font-size: 14px; margin: 0.5em 0 1.5em; }
table.data th, table.data td, table.summary td { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: right; }
table.summary td:first-child { text-align: left; color: #555; }
.warn { color: #b00; font-weight: 600; } img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
.none, .more { color: #777; }
"""


def write_report(data: ReportData, out_dir: str) -> str:
    """Write the charts and ``report.html`` into ``out_dir``; return the HTML path."""
    os.makedirs(out_dir, exist_ok=True)
    charts: list[tuple[str, str]] = []
    if (name := chart_rates(data.rates, out_dir)):
        charts.append((name, "Messages per second in each window: all devices (black) and the busiest devices."))
    for metric in sorted(data.stats["metric"].unique()) if not data.stats.empty else []:
        n = int((data.anomalies["metric"] == metric).sum()) if not data.anomalies.empty else 0
        charts.append((chart_metric(metric, data.stats, data.anomalies, out_dir),
                       f"{metric}: mean per window per device; red crosses are the {n} anomalous points."))
    if (name := chart_talkers(data.talkers, out_dir)):
        charts.append((name, "Devices that sent the most messages."))
    if (name := chart_heat(data.heat, out_dir)):
        charts.append((name, "Messages per topic and window: bright cells are hot topics."))

    def row(label, value):
        cls = " class='warn'" if label.startswith(("corrupt", "unparsed", "silent")) and value not in (0, "0") else ""
        return f"<tr><td>{html.escape(str(label))}</td><td{cls}>{html.escape(_fmt(value))}</td></tr>"

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(data.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(data.title)}</h1>",
        f"<p class='sub'>generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}</p>",
        "<h2>Summary</h2><table class='summary'>",
        *(row(k, v) for k, v in data.summary.items()),
        "</table>",
        *(f"<p>{html.escape(n)}</p>" for n in data.notes),
    ]
    for name, caption in charts:
        parts.append(f"<figure><img src='{html.escape(name)}' alt='{html.escape(caption)}'>"
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts += [
        f"<h2>Anomalies ({len(data.anomalies)})</h2>", _table(data.anomalies),
        f"<h2>Silent devices ({len(data.silent)})</h2>", _table(data.silent),
        "<h2>Top talkers</h2>", _table(data.talkers),
        "</body></html>",
    ]
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return path


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
