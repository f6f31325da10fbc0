"""The admin API's overview (``GET /api/v1/stats``, the dashboard's first page): one object of live figures."""

from __future__ import annotations

from cluster.admin.metrics import process_figures


def overview(front, store, view, figures, history, version: str) -> dict:
    """Connections, sessions, msg/s now and over the last minutes, store size, lag, latency, process figures."""
    series = history.series()
    total, worst = figures.queue_lag()
    ms = 1000.0
    return {
        "member_id": view.member_id,
        "version": version,
        "uptime_s": int(front.clock.seconds() - front.started_at),
        "connections": view.connected(),
        "sessions": len(front.sessions),
        "subscriptions": sum(len(session.subs) for session in list(front.sessions.values())),
        "store_bytes": int(store.size_bytes()),
        "retained": view.retained_count(),
        "lag": {"total": total, "max": worst},
        "rate": {"in": series["in"][-1] if series["in"] else 0.0,
                 "out": series["out"][-1] if series["out"] else 0.0},
        "series": series,
        "listeners": figures.listener_connections(),
        "process": process_figures(),
        "reactor_lag_ms": round(figures.reactor_lag_max() * ms, 3),
        "latency_ms": {"deliver_p50": figures.deliver.quantile(0.5) * ms,
                       "deliver_p99": figures.deliver.quantile(0.99) * ms,
                       "append_p50": figures.append.quantile(0.5) * ms,
                       "append_p99": figures.append.quantile(0.99) * ms},
    }
