"""The dashboard's web app: read-only HTML pages and JSON over one storage prefix.

`create_app(prefix)` returns a FastAPI app with GET routes only:

    /                                     experiments (one row per manifest)
    /experiments/{id}                     an experiment: its DAG picture and a table of step states
    /experiments/{id}?run=RUN             one earlier run of it, as that run left each step
    /steps/{label}                        a step: state, config, status events, logs, loss chart, evaluation
    /steps/{label}/logs/{name}            one log file
    /compare?run=ID&run=ID                runs side by side: loss curves overlaid, the fields that
                                          differ and every recorded metric (pipeline.observe.compare)
    /api/experiments[/{id}], /api/steps/{label}    the same data as JSON, for tools
    /static/...                           CSS, the page script and the vendored Chart.js

Every request reads storage afresh through `pipeline.observe.dashboard.data` (a reload shows the run as
it is now); nothing is written. Pages load nothing from outside the server: no CDN, and
FastAPI's interactive docs (which load Swagger from a CDN) are switched off.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from pipeline.core.prices import price_table
from pipeline.core.records import StepRecord
from pipeline.core.training_figures import FIGURES, figures_text, live_figures
from pipeline.core.usable_numbers import finite_number, usable_time
from pipeline.errors import StorageError
from pipeline.observe.dag_render import DagNode, state_color, to_svg
from pipeline.observe.dashboard import data, is_loopback, step_data
from pipeline.observe.dashboard.run_page import RunPage, read_run_page
from pipeline.observe.render import is_table
from pipeline.storage.files import Storage
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import StepStore

__all__ = ["MAX_DAG_NODES", "MAX_TABLE_ROWS", "create_app"]

HERE = os.path.dirname(os.path.abspath(__file__))
_EXPERIMENT_ID = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_DAG_NODES = 400
"""Larger experiments get the step table without a picture: a sweep's SVG would be megabytes."""
MAX_TABLE_ROWS = 1000
"""Rows of an experiment's step table shown by default (`?all=true` shows every one, `?state=S`
filters): a 100,000-step sweep would otherwise be a 45 MB page."""
NOTE_COLORS = {"WARNING": ("#fff3e0", "#ef6c00")}
LOG_TAIL_LINES = 200
"""Lines of the latest log shown on the step page (the whole log is one click away)."""


def _fmt_time(value: Any) -> str:
    """Seconds since the epoch as UTC `YYYY-MM-DD HH:MM:SS`; '' for None or a time no calendar
    holds (an edited manifest's `1e999`)."""
    if not usable_time(value):
        return ""
    return datetime.datetime.fromtimestamp(value, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _fmt_duration(value: Any) -> str:
    """Seconds as `1h02m`, `3m05s` or `4.2s`; '' for None or a number that is not finite."""
    if not finite_number(value) or value < 0:
        return ""
    if value < 60:
        return f"{value:.1f}s"
    minutes, seconds = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _fmt_number(value: Any) -> str:
    """Floats with 4 significant digits, everything else as is."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _fmt_progress(progress: data.Progress | None) -> str:
    """`45% · 450 of 1000 steps · loss 2.31 · 24.5k tok/s · ETA 3m12s · ckpt 40s ago`; '' for None.

    A training's live figures (`pipeline.core.training_figures`) are shown by name; any other number a
    step reports is shown as `key value`.
    """
    if progress is None:
        return ""
    done = _fmt_number(progress.done) if progress.done % 1 else str(int(progress.done))
    parts = [f"{progress.percent}%"] if progress.percent is not None else []
    if progress.total is not None:
        total = _fmt_number(progress.total) if progress.total % 1 else str(int(progress.total))
        parts.append(f"{done} of {total} {progress.unit}".rstrip())
    else:
        parts.append(f"{done} {progress.unit}".rstrip())
    record = {"done": progress.done, "total": progress.total, "unit": progress.unit, "time": progress.time}
    figures = live_figures({**record, "data": progress.data}, time.time())
    known = {*FIGURES, "checkpoint_time", "interventions"}
    if "loss" in figures:
        parts.append(f"loss {_fmt_number(figures['loss'])}")
    parts.extend(figures_text(figures))
    parts.extend(
        f"{key} {_fmt_number(value)}"
        for key, value in sorted(progress.data.items())
        if key not in known and isinstance(value, int | float)
    )
    return " · ".join(parts)


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities replaced by None: they are not JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):  # mappingproxy and other read-only views
        return dict(value)
    return str(value)


def _plain(value: Any) -> Any:
    """Dataclasses (and whatever holds them) as JSON-ready plain data."""
    return _finite(json.loads(json.dumps(value, default=_json_default)))


def _badge_color(state: str) -> tuple[str, str]:
    """(fill, border) of a state badge: the DAG's colours, plus the notes only `.status` has."""
    return NOTE_COLORS.get(state) or state_color(state)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _dag_svg(detail: data.ExperimentDetail) -> str | None:
    """The experiment's DAG as inline SVG, coloured by each step's live state."""
    if len(detail.steps) > MAX_DAG_NODES:
        return None
    present = {row.label for row in detail.steps}
    nodes = [
        DagNode(
            row.label,
            row.name,
            row.state,
            tuple(d for d in row.deps if d in present),
            row.fn,
            soft_deps=tuple(d for d in row.soft_deps if d in present),
        )
        for row in detail.steps
    ]
    return to_svg(nodes)  # an <svg> element without XML prologue: valid inline in HTML


def create_app(prefix: str, allowed_hosts: Sequence[str] = ()) -> FastAPI:
    """The dashboard of `prefix` (a normalized prefix: absolute local path or URL).

    Requests must name this machine in their `Host` header (a loopback name or address), or one
    of `allowed_hosts`: a page on another site cannot reach a loopback server through a DNS name
    it controls (DNS rebinding).
    """
    storage = open_storage(prefix, confine=True)  # serve nothing a symbolic link points out to
    store = StepStore(storage)
    app = FastAPI(title="Drydock dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    allowed = {h.lower() for h in allowed_hosts}

    @app.middleware("http")
    async def check_host(request: Request, call_next: Any) -> Any:
        host = _host_name(request.headers.get("host", ""))
        if not (is_loopback(host) or host in allowed):
            return JSONResponse({"error": f"Host {host!r} is not served here"}, status_code=421)
        return await call_next(request)

    app.mount("/static", StaticFiles(directory=os.path.join(HERE, "static")), name="static")
    templates = _templates(app, prefix)

    def page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        return templates.TemplateResponse(request, template, context, status_code=status_code)

    def error_page(request: Request, status_code: int, message: str) -> HTMLResponse:
        return page(request, "error.html", status_code, message=message)

    @app.exception_handler(OSError)
    @app.exception_handler(StorageError)
    def storage_failed(request: Request, error: Exception) -> HTMLResponse | JSONResponse:
        # An object store that times out or refuses: say so instead of a bare 500 and a traceback.
        message = f"cannot read the prefix {prefix}: {error}"
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=503)
        return error_page(request, 503, message)

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request) -> HTMLResponse:
        return page(request, "index.html", experiments=data.list_experiments(storage, prefix))

    @app.get("/experiments/{manifest_id}", response_class=HTMLResponse)
    def experiment(
        request: Request,
        manifest_id: str,
        state: str | None = None,
        show_all: bool = Query(False, alias="all"),
        run: str | None = None,
    ) -> HTMLResponse:
        try:
            detail = data.read_experiment(store, prefix, manifest_id, run=run)
        except data.NotFound as e:
            return error_page(request, 404, str(e))
        except ValueError as e:
            return error_page(request, 500, f"the manifest of experiment {manifest_id} is unreadable: {e}")
        rows = [row for row in detail.steps if state is None or row.state == state]
        return page(
            request,
            "experiment.html",
            detail=detail,
            dag_svg=_dag_svg(detail),
            max_dag_nodes=MAX_DAG_NODES,
            counts=data.state_counts(detail.steps),
            rows=rows if show_all else rows[:MAX_TABLE_ROWS],
            matching=len(rows),
            state_filter=state,
        )

    @app.get("/compare", response_class=HTMLResponse)
    def compare(
        request: Request, run: Annotated[list[str] | None, Query()] = None, best: str | None = None
    ) -> HTMLResponse:
        try:
            view = data.read_comparison(store, prefix, run or [], best or None)
        except data.NotFound as e:
            return error_page(request, 404, str(e))
        except ValueError as e:
            return error_page(request, 500, str(e))
        return page(request, "compare.html", view=view, experiments=data.list_experiments(storage, prefix))

    @app.get("/steps/{label:path}/logs/{name}", response_class=HTMLResponse)
    def log(request: Request, label: str, name: str) -> HTMLResponse:
        try:
            text, cut = step_data.read_log(storage, prefix, label, name)
        except data.NotFound as e:
            return error_page(request, 404, str(e))
        return page(request, "log.html", label=label, name=name, text=text, cut=cut)

    @app.get("/steps/{label:path}/figures/{name}")
    def figure(request: Request, label: str, name: str) -> Response:
        try:
            png = step_data.read_figure(storage, prefix, label, name)
        except data.NotFound as e:
            return error_page(request, 404, str(e))
        return Response(png, media_type="image/png", headers={"X-Content-Type-Options": "nosniff"})

    @app.get("/steps/{label:path}/data", response_class=HTMLResponse)
    def step_data_page(request: Request, label: str, reason: str | None = None) -> HTMLResponse:
        try:
            sample = step_data.read_data(storage, prefix, label, reason, DATA_SAMPLES)
        except data.NotFound as e:
            return error_page(request, 404, str(e))
        return page(request, "data.html", label=label, sample=sample, reason=reason, samples=DATA_SAMPLES)

    @app.get("/steps/{label:path}", response_class=HTMLResponse)
    def step(request: Request, label: str, experiment: str | None = None) -> HTMLResponse:
        try:
            detail = step_data.read_step(store, prefix, label)
        except data.NotFound as e:
            return error_page(request, 404, str(e))
        # Only for the breadcrumb link back; a name that is not an experiment id is dropped.
        experiment = experiment if experiment and _EXPERIMENT_ID.match(experiment) else None
        return page(request, "step.html", experiment=experiment, **_step_context(storage, prefix, detail))

    _add_api(app, store, prefix)
    return app


def _templates(app: FastAPI, prefix: str) -> Jinja2Templates:
    templates = Jinja2Templates(directory=os.path.join(HERE, "templates"))
    env = templates.env
    env.filters.update(
        time=_fmt_time,
        duration=_fmt_duration,
        number=_fmt_number,
        pretty=_pretty,
        progress=_fmt_progress,
        is_table=is_table,
    )
    env.tests["startingwith"] = lambda value, start: isinstance(value, str) and value.startswith(start)
    # Links are paths, not absolute URLs: they keep working through an SSH tunnel or a proxy.
    env.globals.update(prefix=prefix, state_color=_badge_color, path_for=app.url_path_for)
    return templates


DATA_SAMPLES = 10
"""Documents shown per reason on a step's data page."""


def _step_context(storage: Storage, prefix: str, detail: data.StepDetail) -> dict[str, Any]:
    """What the step page shows besides the detail itself: the latest log's tail and the chart."""
    latest_log = None
    if detail.logs:
        try:
            text, _cut = step_data.read_log(storage, prefix, detail.label, detail.logs[-1])
        except data.NotFound:  # e.g. a link out of the prefix: the page shows no tail
            text = None
        if text is not None:
            lines = text.splitlines()
            latest_log = (detail.logs[-1], "\n".join(lines[-LOG_TAIL_LINES:]), len(lines) > LOG_TAIL_LINES)
    info = detail.step_json or {}
    run = _run_page(storage, prefix, detail)
    chart = None
    if detail.metrics is not None:
        planned = (info.get("summary") or {}).get("num_train_steps")
        chart = {
            "steps": list(detail.metrics.steps),
            "loss": list(detail.metrics.loss),
            "learning_rate": list(detail.metrics.learning_rate),
            "eval_steps": list(detail.metrics.eval_steps),
            "eval_loss": list(detail.metrics.eval_loss),
            # Spikes, NaN/Inf losses, skipped updates and rewinds: markers on the loss.
            "events": [dict(e) for e in detail.metrics.events],
            # While training runs, the x-axis spans the planned steps: how far along it is shows.
            "planned_steps": planned if isinstance(planned, int) else None,
            # The predicted eval loss and its band, where the training was given one.
            "prediction": run.prediction["points"] if run.prediction else None,
            "tokens_per_second": list(detail.metrics.tokens_per_second),
            "mfu": list(detail.metrics.mfu),
            "step_seconds": detail.metrics.step_seconds,
            "router_steps": list(detail.metrics.router_steps),
            "router_max_load_ratio": list(detail.metrics.router_max_load_ratio),
            "router_mean_max_load_ratio": list(detail.metrics.router_mean_max_load_ratio),
        }
    return {
        "detail": detail,
        "run": run,
        "ledger": _ledger(storage, prefix, detail),
        "throughput": _throughput(detail.metrics),
        "latest_log": latest_log,
        "chart": chart,
        "last_metrics": _finite(dict(detail.metrics.last)) if detail.metrics else {},
        "last_router": _last_router(detail.metrics),
        "hyperparameters": _hyperparameters(info),
        "inputs": _inputs(info, prefix),
        "figures": step_data.figures_of(detail.files),
        "has_data": step_data.has_data(storage, prefix, detail.label),
        "failure": _failure(detail),
        "refresh": REFRESH_SECONDS if detail.state == "RUNNING" and not detail.stale else None,
    }


def _ledger(storage: Storage, prefix: str, detail: data.StepDetail) -> dict[str, Any] | None:
    """Where the step's device time went (`pipeline.core.ledger`), as the page shows it."""
    record = StepRecord(events=tuple(detail.events), step_json=detail.step_json)
    ledger = StepStore(storage).ledger(f"{prefix.rstrip('/')}/{detail.label}", record, time.time())
    if ledger is None:
        return None
    return ledger.to_json(price_table())


def _run_page(storage: Storage, prefix: str, detail: data.StepDetail) -> RunPage:
    """The run page's sections of a step (`run_page`): prediction, hosts, attempts, alerts, logs."""
    info = detail.step_json or {}
    name = info.get("name") if isinstance(info.get("name"), str) else None
    directory = f"{prefix.rstrip('/')}/{detail.label}"
    return read_run_page(
        storage, prefix, directory, name, detail.events, detail.logs, detail.metrics, time.time()
    )


def _last_router(metrics: data.Metrics | None) -> Mapping[str, Any] | None:
    """The expert balance at the last step router statistics were logged, if any."""
    if metrics is None or not metrics.router_steps:
        return None
    return {
        "step": metrics.router_steps[-1],
        "worst": metrics.router_max_load_ratio[-1],
        "mean": metrics.router_mean_max_load_ratio[-1],
    }


def _throughput(metrics: data.Metrics | None) -> bool:
    return metrics is not None and any(v is not None for v in (*metrics.tokens_per_second, *metrics.mfu))


def _host_name(header: str) -> str:
    """The host of a `Host` header, without its port or an IPv6 address's brackets, lowercased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


REFRESH_SECONDS = 10
"""A page showing something that runs reloads itself this often."""


def _hyperparameters(info: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The step's versioned values as `a.b.c` rows: what makes this run this run."""
    versioned = (info.get("identity") or {}).get("versioned") if isinstance(info, Mapping) else None
    skipped = info.get("inapplicable") if isinstance(info, Mapping) else None
    hidden = {str(p) for p in skipped} if isinstance(skipped, list) else set()
    rows: list[tuple[str, Any]] = []

    def walk(value: Any, path: str) -> None:
        if path in hidden:
            return  # a field that does not apply to this step (`applies_when`)
        if isinstance(value, Mapping):
            for key, item in value.items():
                if key != "__class__":
                    walk(item, f"{path}.{key}" if path else str(key))
        else:
            rows.append((path, value))

    walk(versioned if isinstance(versioned, Mapping) else {}, "")
    return rows


def _inputs(info: Mapping[str, Any], prefix: str) -> list[tuple[str, bool]]:
    """(label, waits) of the steps this one reads, from the output paths `.step.json` records."""
    out = []
    for key, waits in (("deps", True), ("soft_deps", False)):
        for path in info.get(key) or ():
            if isinstance(path, str) and path.startswith(prefix.rstrip("/") + "/"):
                out.append((path[len(prefix.rstrip("/")) + 1 :], waits))
    return out


def _failure(detail: data.StepDetail) -> Any:
    """The last attempt's error, for a step whose last state is FAILED."""
    if detail.state != "FAILED":
        return None
    for event in reversed(detail.events):
        if event.event == "FAILED":
            return event
    return None


def _add_api(app: FastAPI, store: StepStore, prefix: str) -> None:
    """The JSON routes: the same data as the pages, for tools."""

    @app.get("/api/experiments")
    def api_experiments() -> JSONResponse:
        return JSONResponse(_plain(data.list_experiments(store.storage, prefix)))

    @app.get("/api/experiments/{manifest_id}")
    def api_experiment(manifest_id: str) -> JSONResponse:
        try:
            return JSONResponse(_plain(data.read_experiment(store, prefix, manifest_id)))
        except data.NotFound as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        except ValueError as e:
            return JSONResponse({"error": f"manifest {manifest_id} is unreadable: {e}"}, status_code=500)

    @app.get("/api/compare")
    def api_compare(run: Annotated[list[str] | None, Query()] = None) -> JSONResponse:
        try:
            return JSONResponse(_plain(data.read_comparison(store, prefix, run or [])))
        except data.NotFound as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=500)

    @app.get("/api/steps/{label:path}")
    def api_step(label: str) -> JSONResponse:
        try:
            detail = step_data.read_step(store, prefix, label)
        except data.NotFound as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        return JSONResponse({**_plain(detail), "run": _plain(_run_page(store.storage, prefix, detail))})
