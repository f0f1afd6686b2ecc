"""The `jigsaw` command line: tables for people, `--json` for scripts.

API commands find the server and token through `api.credentials.resolve` (`--url` /
`--token`, then `JIGSAW_API_URL` / `JIGSAW_API_TOKEN`, then the credentials.json that
`jigsaw up` writes under JIGSAW_HOME). `db` and `token` work directly on the database
named by the settings. Exit codes: 0 success, 1 the API or database refused or could not
be reached, 2 bad input (usage, an unreadable or invalid job spec).
"""

import json
import math
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from api.client import ApiError, JigsawClient
from api.credentials import resolve
from api.progress import StepProgress
from api.simulate import simulate
from api.specfile import SpecFileError, read_spec_file
from jigsaw import codearchive
from jigsaw.jobspec import Hyperparameters, JobSpec, TargetMetric, checked_workload
from scheduler.core.states import JobState
from scheduler.settings import Settings

app = typer.Typer(
    name="jigsaw",
    help="JigSaw: an iteration-level GPU cluster scheduler for deep-learning training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold tokens
)
db_app = typer.Typer(
    help="Schema migrations, run directly on the database the settings name.",
    no_args_is_help=True,
)
token_app = typer.Typer(
    help="Bearer tokens: `create` writes directly in the database; `list` and `revoke` "
    "go through the API (admins: every token; users: their own).",
    no_args_is_help=True,
)
node_app = typer.Typer(
    help="Drain, undrain and remove nodes through the API (admins).", no_args_is_help=True
)
app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")
queue_app = typer.Typer(
    help="Queues: GPU quotas, borrowing and fair-share weights (`list`, `show`: everyone; "
    "`create`, `edit`, `delete`: admins).",
    no_args_is_help=True,
)
app.add_typer(node_app, name="node")
app.add_typer(queue_app, name="queue")
app.command()(simulate)

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

EXIT_ERROR = 1
EXIT_BAD_INPUT = 2

STATE_STYLE = {
    "QUEUED": "yellow",
    "SCHEDULED": "cyan",
    "RUNNING": "green",
    "SUSPENDED": "magenta",
    "SUCCEEDED": "bold green",
    "FAILED": "bold red",
    "CANCELLED": "dim",
}
TERMINAL_STATES = {state.value for state in JobState if state.terminal}
_DURATION = re.compile(r"([0-9]{1,9})([smhdw])")
_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass
class _Options:
    url: str | None = None
    token: str | None = None


# -- helpers --------------------------------------------------------------------------


def _fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        lines = "; ".join(_format_errors(exc))
        _fail(f"invalid JIGSAW_* setting: {lines}", EXIT_BAD_INPUT)


def _options(ctx: typer.Context) -> _Options:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, _Options) else _Options()


@contextmanager
def _api(ctx: typer.Context) -> Iterator[JigsawClient]:
    """A client for the configured server; any ApiError becomes one red line and exit 1."""
    options = _options(ctx)
    settings = _settings()
    credentials = resolve(settings, url=options.url, token=options.token)
    if not credentials.token:
        _fail(
            f"no API token: start the server with `jigsaw up` (it stores one in "
            f"{settings.home / 'credentials.json'}) or set JIGSAW_API_TOKEN"
        )
    try:
        with JigsawClient(credentials.url, credentials.token) as client:
            yield client
    except ApiError as exc:
        _fail(str(exc))


def _echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=False))


def _state(state: str) -> str:
    return f"[{STATE_STYLE.get(state, '')}]{state}[/]" if state in STATE_STYLE else state


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _ago(value: Any) -> str:
    moment = _parse_time(value)
    if moment is None:
        return "-"
    seconds = max(0, int((datetime.now(UTC) - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _when(value: Any) -> str:
    moment = _parse_time(value)
    if moment is None:
        return "-"
    return f"{moment.astimezone().strftime('%Y-%m-%d %H:%M:%S')} ({_ago(value)})"


def _reason(job: dict[str, Any]) -> str:
    """Why a waiting job did not start, with its place in line ("" when it is not
    waiting)."""
    reason = str(job.get("pending_reason") or "")
    position = job.get("position")
    if isinstance(position, dict):
        place = (
            f"#{position.get('queue')} in queue {job.get('queue')}, "
            f"#{position.get('overall')} overall"
        )
        return f"{reason} ({place})" if reason else place
    return reason


def _progress(job: dict[str, Any]) -> str:
    """What `max_iterations` counts done, and the iterations where they differ (an
    adaptive batch's steps count AdaScale's gain)."""
    done = job.get("iterations_done", 0)
    progress = math.floor(job.get("progress", done))
    spec = job.get("spec") or {}
    total = spec.get("max_iterations") if isinstance(spec, dict) else None
    text = f"{progress:,}/{total:,} ({100 * progress / total:.0f}%)" if total else f"{progress:,}"
    return text if progress == done else f"{text} in {done:,} iterations"


_SPARK_POINTS = 40  # buckets of iterations in `jigsaw job`'s loss sparkline
_SPARK_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """One bar per value, from the lowest (▁) to the highest (█)."""
    low, high = min(values), max(values)
    if high - low <= 1e-12 * max(1.0, abs(high)):
        return _SPARK_BARS[len(_SPARK_BARS) // 2 - 1] * len(values)
    top = len(_SPARK_BARS) - 1
    return "".join(_SPARK_BARS[round((value - low) / (high - low) * top)] for value in values)


def _metric_rows(job: dict[str, Any], points: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The job's last evaluation and its latest iterations, with a sparkline of the loss."""
    rows: list[tuple[str, str]] = []
    evaluation = job.get("metrics") or {}
    if evaluation:
        rows.append(
            (
                "evaluation",
                ", ".join(f"{escape(str(k))} {v:.4g}" for k, v in sorted(evaluation.items())),
            )
        )
    if not points:
        rows.append(("iterations", "no metrics reported yet"))
        return rows
    last = points[-1]
    latest = [f"iteration {last['iteration']:,}"]
    for key, label, fmt in (
        ("loss", "loss", "{:.4g}"),
        ("step_seconds", "step", "{:.3f} s"),
        ("samples_per_second", "samples/s", "{:,.0f}"),
        ("utilization", "utilization", "{:.0%}"),
        ("spb_depth", "spb depth", "{:.2f}"),
        ("workers", "workers", "{:.3g}"),
        ("batch_size", "batch", "{:,.0f}"),
        ("learning_rate", "lr", "{:.3g}"),
    ):
        if last.get(key) is not None:
            latest.append(f"{label} {fmt.format(last[key])}")
    rows.append(("latest", ", ".join(latest)))
    losses = [p["loss"] for p in points if p.get("loss") is not None]
    if len(losses) >= 2:  # from the first reported iteration to the latest
        rows.append(("loss", f"{losses[0]:.4g} {sparkline(losses)} {losses[-1]:.4g}"))
    return rows


# -- job spec files -------------------------------------------------------------------


def load_spec_file(path: Path) -> Any:
    """The parsed file (JSON for `.json`, YAML otherwise); exit 2 with the reason if not."""
    try:
        return read_spec_file(path)
    except SpecFileError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)


def _format_loc(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(spec)"


def _format_errors(exc: ValidationError) -> list[str]:
    lines = []
    for error in exc.errors(include_url=False):
        message = str(error.get("msg", ""))
        kind = error.get("type")
        if kind == "extra_forbidden":
            message = "unknown field"
        elif kind == "missing":
            message = "required field is missing"
        message = message.removeprefix("Value error, ")
        lines.append(f"{_format_loc(tuple(error.get('loc', ())))}: {message}")
    return lines


def validate_spec(path: Path, data: Any) -> JobSpec:
    if not isinstance(data, dict):
        _fail(f"{path}: a job spec is a mapping of fields (name, workload, ...)", EXIT_BAD_INPUT)
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        err.print(f"[red]error:[/red] {escape(str(path))} is not a valid job spec:", soft_wrap=True)
        for line in _format_errors(exc):
            err.print(f"  - {escape(line)}", soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


# -- root -----------------------------------------------------------------------------


@app.callback()
def _root(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option("--url", help="API base URL (default: JIGSAW_API_URL, then credentials)."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option("--token", help="Bearer token (default: JIGSAW_API_TOKEN, then credentials)."),
    ] = None,
) -> None:
    ctx.obj = _Options(url=url, token=token)


# -- server ---------------------------------------------------------------------------


@app.command()
def up(
    host: Annotated[str | None, typer.Option(help="Bind address [JIGSAW_API_HOST].")] = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Port [JIGSAW_API_PORT]; 0 picks one.")
    ] = None,
    local_agents: Annotated[
        int,
        typer.Option(min=0, max=64, help="Worker agents with virtual GPUs to start here."),
    ] = 0,
    gpus_per_agent: Annotated[
        int, typer.Option(min=1, max=64, help="Virtual GPUs of each local agent.")
    ] = 2,
    simulated_nodes: Annotated[
        int,
        typer.Option(
            min=0, max=1024, help="Instead of agents: simulated nodes whose jobs only pretend."
        ),
    ] = 0,
    gpus_per_node: Annotated[
        int, typer.Option(min=1, max=64, help="Virtual GPUs per simulated node.")
    ] = 4,
    scheduler: Annotated[
        bool, typer.Option("--scheduler/--no-scheduler", help="Run the scheduler loop here.")
    ] = True,
    sim_speed: Annotated[
        float, typer.Option(min=0.001, help="Iterations per second of simulated jobs.")
    ] = 50.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    access_log: Annotated[bool, typer.Option(help="Log every HTTP request.")] = False,
) -> None:
    """Run the API and, as leader, the scheduler and the agents' gRPC endpoint, until Ctrl-C."""
    from api.server import AddressTaken, serve
    from worker_agent.isolation import IsolationError
    from worker_agent.runtime.lifeline import UP_PARENT_PID_ENV, OrphanedError, die_with_parent

    if local_agents and simulated_nodes:
        _fail("give --local-agents or --simulated-nodes, not both", EXIT_BAD_INPUT)
    try:
        die_with_parent(UP_PARENT_PID_ENV, "the program (pid {pid}) that started it is gone")
    except OrphanedError as exc:
        _fail(f"not starting: {exc}")
    settings = _settings()
    try:
        serve(
            settings,
            host=host if host is not None else settings.api.host,
            port=port if port is not None else settings.api.port,
            scheduler=scheduler,
            simulated_nodes=simulated_nodes,
            gpus_per_node=gpus_per_node,
            sim_iterations_per_second=sim_speed,
            local_agents=local_agents,
            gpus_per_agent=gpus_per_agent,
            log_level=log_level.lower(),
            access_log=access_log,
        )
    except AddressTaken as exc:
        _fail(str(exc))
    except IsolationError as exc:
        _fail(f"cannot run the local agents' training processes: {exc}")


@app.command()
def agent(
    scheduler: Annotated[
        str | None, typer.Option(help="The scheduler's gRPC HOST:PORT [JIGSAW_AGENT_SCHEDULER].")
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(help="`auto` (CUDA devices) or N virtual GPUs [JIGSAW_AGENT_GPUS]."),
    ] = None,
    node_name: Annotated[
        str | None, typer.Option(help="This node's name [JIGSAW_AGENT_NODE_NAME].")
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(help="Host other nodes reach this one at [JIGSAW_AGENT_ADDRESS]."),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(help="File holding the cluster token [JIGSAW_AGENT_TOKEN_FILE]."),
    ] = None,
    work_dir: Annotated[
        Path | None, typer.Option(help="Worker configs and logs [JIGSAW_AGENT_WORK_DIR].")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run a worker agent: serve this node's GPUs to the scheduler until Ctrl-C."""
    import threading

    from api.logs import configure_logging

    # The agent forks training processes, as another user when it runs as root (fork, not
    # vfork): gRPC's fork handlers would then run in the child before exec, and can abort
    # it there. Read when gRPC starts, so set before the agent imports it.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    from worker_agent.agent import AgentRejected, run_agent
    from worker_agent.isolation import IsolationError
    from worker_agent.runtime.lifeline import (
        UP_PID_ENV,
        OrphanedError,
        die_with_parent,
        watch_lifeline,
    )
    from worker_agent.settings import AgentSettings

    overrides: dict[str, Any] = {
        "scheduler": scheduler,
        "gpus": gpus,
        "node_name": node_name,
        "address": address,
        "token_file": token_file,
        "work_dir": work_dir,
    }
    try:
        settings = AgentSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        _fail(f"invalid agent setting: {'; '.join(_format_errors(exc))}", EXIT_BAD_INPUT)
    configure_logging(log_level, _settings().log.format)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _signum, _frame: stop.set())
    try:
        # A local agent of `jigsaw up` never outlives it (`lifeline`).
        if die_with_parent(UP_PID_ENV, "jigsaw up (pid {pid}) that started this agent is gone"):
            watch_lifeline(sys.stdin.buffer, stop)
    except OrphanedError as exc:
        _fail(f"not starting: {exc}")
    try:
        run_agent(settings, stop)
    except AgentRejected as exc:
        _fail(f"the scheduler at {settings.scheduler} refused this agent: {exc}")
    except IsolationError as exc:
        _fail(f"cannot run training processes: {exc}")


# -- jobs -----------------------------------------------------------------------------


@app.command()
def submit(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="Job spec, YAML or JSON.", show_default=False)],
    code: Annotated[
        Path | None,
        typer.Option(
            "--code",
            help="Upload this directory (less what its .jigsawignore names) as the job's "
            "code: the agents put it first on the workers' import path.",
            file_okay=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the created job as JSON.")] = False,
) -> None:
    """Validate a job spec file locally, then submit it (with its code: --code DIR)."""
    spec = validate_spec(file, load_spec_file(file))
    submitted = spec.model_dump(mode="json", exclude_unset=True)
    archive = None
    if code is not None:
        try:
            # The API's own limit (JIGSAW_API_MAX_CODE_BYTES) is checked on upload.
            archive = codearchive.pack(
                code, codearchive.Limits(max_bytes=codearchive.MAX_BYTES_CEILING)
            )
        except (codearchive.ArchiveError, OSError) as exc:
            _fail(f"--code {code}: {exc}", EXIT_BAD_INPUT)
    with _api(ctx) as client:
        if archive is not None:
            submitted["code"] = client.upload_code(archive)["digest"]
        job = client.submit(submitted)
    if as_json:
        _echo_json(job)
        return
    out.print(
        f"submitted job [bold]{job.get('id')}[/bold] ({escape(str(job.get('name')))}): "
        f"{_state(str(job.get('state')))}"
    )


@app.command("jobs")
def list_jobs(
    ctx: typer.Context,
    state: Annotated[
        list[JobState] | None,
        typer.Option("--state", "-s", case_sensitive=False, help="Only these states (repeat)."),
    ] = None,
    owner: Annotated[str | None, typer.Option(help="Only this user's jobs (admins).")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Page size.")] = 50,
    after: Annotated[
        int | None, typer.Option(min=1, help="Page after this job id (from the last page).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page as JSON.")] = False,
) -> None:
    """List jobs, newest first."""
    with _api(ctx) as client:
        page = client.list_jobs(
            states=[s.value for s in state or []], owner=owner, limit=limit, after=after
        )
    if as_json:
        _echo_json(page)
        return
    items = page.get("items", [])
    if not items:
        out.print("no jobs")
        return
    table = Table(box=None, header_style="bold")
    for column, justify in (
        ("ID", "right"),
        ("NAME", "left"),
        ("OWNER", "left"),
        ("STATE", "left"),
        ("GPUS", "right"),
        ("PROGRESS", "right"),
        ("PRIO", "right"),
        ("QUEUE", "left"),
        ("SUBMITTED", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for job in items:
        table.add_row(
            str(job.get("id")),
            escape(str(job.get("name"))),
            escape(str(job.get("owner"))),
            _state(str(job.get("state"))) + (" [yellow]![/]" if _reason(job) else ""),
            str(job.get("workers")),
            _progress(job),
            str(job.get("priority")),
            escape(str(job.get("queue"))),
            _ago(job.get("created_at")),
        )
    out.print(table)
    for job in items:
        if reason := _reason(job):
            out.print(f"[yellow]![/] job {job.get('id')} waits: {escape(reason)}")
    footer = f"{len(items)} of {page.get('total', len(items))} job(s)"
    if page.get("next_after"):
        footer += f"; next page: jigsaw jobs --after {page['next_after']}"
    out.print(f"[dim]{footer}[/dim]")


@app.command("job")
def show_job(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="Job id.", show_default=False)],
    as_json: Annotated[
        bool, typer.Option("--json", help='Print {"job": ..., "events": [...]}.')
    ] = False,
) -> None:
    """Show one job: its state, latest metrics, a sparkline of its loss, its events."""
    with _api(ctx) as client:
        job = client.get_job(job_id)
        events = client.events(job_id).get("items", [])
        points = [] if as_json else client.metrics(job_id, points=_SPARK_POINTS).get("points", [])
    if as_json:
        _echo_json({"job": job, "events": events})
        return
    spec = job.get("spec") or {}
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column()
    rows: list[tuple[str, str]] = [
        ("job", f"{job.get('id')} ({escape(str(job.get('name')))})"),
        ("owner", escape(str(job.get("owner")))),
        ("state", _state(str(job.get("state")))),
        *([("waiting", f"[yellow]{escape(reason)}[/]")] if (reason := _reason(job)) else []),
        *(
            [("estimated start", _when(job.get("estimated_start_at")))]
            if job.get("estimated_start_at")
            else []
        ),
        ("message", escape(str(job.get("message") or "-"))),
        ("workload", escape(str(spec.get("workload", "-")))),
        ("workers", str(job.get("workers"))),
        ("progress", _progress(job)),
        ("queue / priority", f"{escape(str(job.get('queue')))} / {job.get('priority')}"),
        ("attempts", str(job.get("attempts"))),
        (
            "spb / backprop",
            f"{escape(json.dumps(spec.get('spb', 'off')))} / "
            f"{escape(str(spec.get('backprop', 'standard')))}",
        ),
        ("submitted", _when(job.get("created_at"))),
        ("started", _when(job.get("started_at"))),
        ("finished", _when(job.get("finished_at"))),
    ]
    rows += _metric_rows(job, points)
    for key, value in rows:
        info.add_row(key, value)
    out.print(info)
    if not events:
        return
    table = Table(title="events", box=None, header_style="bold", title_justify="left")
    for column in ("TIME", "KIND", "CHANGE", "ACTOR", "MESSAGE"):
        table.add_column(column)
    for event in events:
        change = ""
        if event.get("to_state"):
            before = event.get("from_state") or "-"
            change = f"{before} → {_state(str(event['to_state']))}"
        moment = _parse_time(event.get("created_at"))
        table.add_row(
            moment.astimezone().strftime("%H:%M:%S") if moment else "-",
            escape(str(event.get("kind", ""))),
            change,
            escape(str(event.get("actor", ""))),
            escape(str(event.get("message", ""))),
        )
    out.print(table)


@app.command()
def cancel(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="Job id.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the job as JSON.")] = False,
) -> None:
    """Cancel a job; the scheduler frees its GPUs on its next round."""
    with _api(ctx) as client:
        job = client.cancel(job_id)
    if as_json:
        _echo_json(job)
        return
    out.print(
        f"job {job.get('id')} ({escape(str(job.get('name')))}): {_state(str(job.get('state')))}"
    )


@app.command()
def suspend(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="Job id.", show_default=False)],
) -> None:
    """Checkpoint a running job at its next iteration boundary and free its GPUs."""
    with _api(ctx) as client:
        job = client.suspend(job_id)
    out.print(f"job {job.get('id')}: {_state(str(job.get('state')))}")


@app.command()
def resume(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="Job id.", show_default=False)],
) -> None:
    """Queue a suspended job again; it continues from its checkpoint."""
    with _api(ctx) as client:
        job = client.resume(job_id)
    out.print(f"job {job.get('id')}: {_state(str(job.get('state')))}")


@app.command()
def logs(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="Job id.", show_default=False)],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
) -> None:
    """Print what the job's training processes wrote (rank-prefixed lines)."""
    with _api(ctx) as client:
        after, ended = 0, False
        while True:
            page = client.logs(job_id, after=after)
            items = page.get("items", [])
            for line in items:
                typer.echo(f"[rank {line.get('rank')}] {line.get('message')}")
            after = int(page.get("next_after", after))
            if items:
                continue
            if not follow or ended:
                return
            # After the job ends, one more pass picks up lines written just before.
            ended = client.get_job(job_id).get("state") in TERMINAL_STATES
            if not ended:
                time.sleep(1.0)


@app.command()
def cluster(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the cluster as JSON.")] = False,
) -> None:
    """Nodes, their GPUs and which jobs hold them."""
    with _api(ctx) as client:
        view = client.cluster()
    if as_json:
        _echo_json(view)
        return
    nodes = view.get("nodes", [])
    if not nodes:
        out.print("no nodes: start worker agents, or `jigsaw up --local-agents N`")
    for node in nodes:
        alive = "[green]alive[/green]" if node.get("alive") else "[red]down[/red]"
        version = node.get("agent_version") or "-"
        title = (
            f"[bold]{escape(str(node.get('name')))}[/bold]  {alive}  agent {escape(version)}  "
            f"heartbeat {_ago(node.get('last_heartbeat_at'))}"
        )
        if node.get("drained_at"):
            title += f"  [yellow]drained[/yellow] {_ago(node.get('drained_at'))}"
        if node.get("schedulable") is False:
            reason = node.get("unschedulable_reason") or "unschedulable"
            title += f"  [yellow]{escape(str(reason))}[/yellow]"
        out.print(title, soft_wrap=True)
        table = Table(header_style="bold")
        for column in ("GPU", "KIND", "MEMORY", "HOLDERS"):
            table.add_column(column)
        for gpu in node.get("gpus", []):
            holders = [
                f"job {h.get('job_id')} {escape(str(h.get('job_name')))} rank {h.get('rank')}"
                + (
                    f" util {100 * h['utilization']:.0f}%"
                    if h.get("utilization") is not None
                    else ""
                )
                + (f" spb {escape(json.dumps(h['spb']))}" if h.get("spb") else "")
                for h in gpu.get("holders", [])
            ]
            kind = escape(str(gpu.get("kind"))) + (" (virtual)" if gpu.get("virtual") else "")
            memory = gpu.get("memory_bytes") or 0
            table.add_row(
                str(gpu.get("index")),
                kind,
                f"{memory / 1024**3:.0f} GiB",
                "\n".join(holders) if holders else "[dim]free[/dim]",
            )
        out.print(table)
    totals = view.get("totals") or {}
    if totals:
        out.print(
            f"GPUs: {totals.get('gpus', 0)} total, {totals.get('gpus_busy', 0)} busy, "
            f"{totals.get('gpus_free', 0)} free; jobs: {totals.get('jobs_running', 0)} running, "
            f"{totals.get('jobs_queued', 0)} queued"
        )


@app.command()
def whoami(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """Who the configured token acts as."""
    with _api(ctx) as client:
        me = client.whoami()
    if as_json:
        _echo_json(me)
        return
    for key, value in me.items():
        out.print(f"[bold]{escape(str(key))}[/bold]: {escape(str(value))}")


@app.command()
def dashboard(
    ctx: typer.Context,
    open_browser: Annotated[
        bool, typer.Option("--open", help="Also open it in this machine's web browser.")
    ] = False,
) -> None:
    """Print the dashboard's address, signed in with the configured token.

    The token travels in the URL's fragment (after `#`), which browsers never send to a
    server; the page stores it for the tab and removes it from the address bar.
    """
    options = _options(ctx)
    credentials = resolve(_settings(), url=options.url, token=options.token)
    with _api(ctx) as client:
        client.whoami()  # the token works, or exit 1 with the reason
    url = f"{credentials.url.rstrip('/')}/ui/#token={credentials.token}"
    typer.echo(url)
    if open_browser:
        import webbrowser

        webbrowser.open(url)


# -- database -------------------------------------------------------------------------


@contextmanager
def _database() -> Iterator[Any]:
    """An engine on the configured database; database errors become one line and exit 1."""
    from sqlalchemy.exc import SQLAlchemyError

    from scheduler.db import engine_from_settings

    settings = _settings()
    engine = engine_from_settings(settings)
    try:
        yield engine
    except SQLAlchemyError as exc:
        message = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        where = engine.url.render_as_string(hide_password=True)
        _fail(f"database error on {where}: {message}")
    finally:
        engine.dispose()


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
) -> None:
    """Migrate the schema up (also run by every `jigsaw up`)."""
    from scheduler.migrate import current_revision, upgrade

    with _database() as engine:
        upgrade(engine, revision)
        out.print(f"database at revision {current_revision(engine)}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision (`base` = empty).")],
) -> None:
    """Migrate the schema down to REVISION."""
    from scheduler.migrate import current_revision, downgrade

    with _database() as engine:
        downgrade(engine, revision)
        out.print(f"database at revision {current_revision(engine) or 'base (empty)'}")


@db_app.command("current")
def db_current() -> None:
    """Print the schema revision and whether it is the latest."""
    from scheduler.migrate import current_revision, head_revision

    with _database() as engine:
        current, head = current_revision(engine), head_revision(engine)
    status = "up to date" if current == head else "behind: run `jigsaw db upgrade`"
    out.print(f"current {current or 'base (empty)'}, head {head} ({status})")


def _duration_seconds(text: str) -> int:
    """`30d`, `12h`, `90m`, `45s` or `2w` in seconds; exit 2 otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        _fail(f"--expires-in {text!r}: write a number and a unit (s, m, h, d, w), e.g. 30d", 2)
    return int(match.group(1)) * _DURATION_SECONDS[match.group(2)]


@token_app.command("create")
def token_create(
    user: Annotated[
        str | None, typer.Option(help="Create a user token for this user (created if new).")
    ] = None,
    admin: Annotated[bool, typer.Option(help="Make the user an admin.")] = False,
    agent: Annotated[
        bool, typer.Option(help="Create the cluster token worker agents use.")
    ] = False,
    description: Annotated[str, typer.Option(help="Free text stored with the token.")] = "",
    expires_in: Annotated[
        str | None,
        typer.Option(help="Refuse the token after this long, e.g. 30d, 12h (default: never)."),
    ] = None,
) -> None:
    """Issue a token and print only the token on stdout (it is stored hashed)."""
    from datetime import timedelta

    from scheduler.db import session_factory, transaction
    from scheduler.migrate import is_up_to_date
    from scheduler.models.users import (
        AGENT_SCOPE,
        USER_NAME_PATTERN,
        USER_SCOPE,
        get_or_create_user,
        issue_token,
    )
    from scheduler.orm import utcnow

    if (user is None) == (not agent):
        _fail("give exactly one of --user NAME or --agent", EXIT_BAD_INPUT)
    if agent and admin:
        _fail("--admin applies to user tokens only", EXIT_BAD_INPUT)
    if user is not None and not re.fullmatch(USER_NAME_PATTERN, user):
        _fail(
            f"invalid user name {user!r}: 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            EXIT_BAD_INPUT,
        )
    lifetime = _duration_seconds(expires_in) if expires_in is not None else None
    with _database() as engine:
        if not is_up_to_date(engine):
            _fail("the database schema is not up to date: run `jigsaw db upgrade` first")
        expires_at = utcnow() + timedelta(seconds=lifetime) if lifetime is not None else None
        with transaction(session_factory(engine)) as session:
            if agent:
                token = issue_token(
                    session,
                    scope=AGENT_SCOPE,
                    description=description[:200],
                    expires_at=expires_at,
                )
            else:
                assert user is not None
                owner = get_or_create_user(session, user, is_admin=admin)
                token = issue_token(
                    session,
                    scope=USER_SCOPE,
                    user=owner,
                    description=description[:200],
                    expires_at=expires_at,
                )
    typer.echo(token)


@token_app.command("list")
def token_list(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option(help="Only this user's tokens (admins).")] = None,
    revoked: Annotated[bool, typer.Option("--revoked", help="Include revoked tokens.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the tokens as JSON.")] = False,
) -> None:
    """Tokens you may see (admins: every token), oldest first; never the tokens themselves."""
    with _api(ctx) as client:
        page = client.tokens(user=user, revoked=revoked)
    if as_json:
        _echo_json(page)
        return
    items = page.get("items", [])
    if not items:
        out.print("no tokens")
        return
    table = Table(box=None, header_style="bold")
    columns = ["ID", "PREFIX", "KIND", "USER", "CREATED", "LAST USED", "EXPIRES"]
    if revoked:
        columns.append("REVOKED")
    for column in [*columns, "DESCRIPTION"]:
        table.add_column(column)
    now = datetime.now(UTC)
    for token in items:
        expires = _parse_time(token.get("expires_at"))
        expiry = "never" if expires is None else _when(token.get("expires_at"))
        if expires is not None and expires <= now:
            expiry = f"[red]expired[/red] {escape(expiry)}"
        row = [
            str(token.get("id")),
            escape(str(token.get("prefix"))),
            escape(str(token.get("kind"))),
            escape(str(token.get("user") or "-")),
            _ago(token.get("created_at")),
            _ago(token.get("last_used_at")),
            expiry,
        ]
        if revoked:
            row.append(_ago(token.get("revoked_at")))
        table.add_row(*row, escape(str(token.get("description") or "")))
    out.print(table)


@token_app.command("revoke")
def token_revoke(
    ctx: typer.Context,
    key: Annotated[
        str, typer.Argument(help="The token's prefix (or id), from `jigsaw token list`.")
    ],
) -> None:
    """Revoke a token: refused at once by the server that revoked it, and by other
    replicas within JIGSAW_API_AUTH_CACHE_SECONDS."""
    with _api(ctx) as client:
        token = client.revoke_token(key)
    owner = token.get("user") or "the agents"
    out.print(f"revoked token {escape(str(token.get('prefix')))} of {escape(str(owner))}")


# -- nodes ----------------------------------------------------------------------------


def _node_jobs(change: dict[str, Any]) -> str:
    moved = [
        f"{len(change.get(key) or [])} {word} ({', '.join(map(str, change.get(key) or []))})"
        for key, word in (("jobs_suspended", "suspended"), ("jobs_requeued", "requeued"))
        if change.get(key)
    ]
    return f"; jobs {', '.join(moved)}" if moved else ""


@node_app.command("drain")
def node_drain(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Node name.", show_default=False)],
    now: Annotated[
        bool,
        typer.Option(
            "--now",
            help="Also move its jobs: running ones checkpoint at their next iteration "
            "boundary and are placed on other nodes.",
        ),
    ] = False,
) -> None:
    """Place no new jobs on a node; its jobs finish there unless --now."""
    with _api(ctx) as client:
        change = client.drain_node(name, now=now)
    out.print(f"node {escape(name)}: drained{escape(_node_jobs(change))}")


@node_app.command("undrain")
def node_undrain(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Node name.", show_default=False)],
) -> None:
    """Place jobs on a drained node again."""
    with _api(ctx) as client:
        client.undrain_node(name)
    out.print(f"node {escape(name)}: undrained")


@node_app.command("remove")
def node_remove(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Node name.", show_default=False)],
) -> None:
    """Forget a drained node that no job holds and no live agent serves."""
    with _api(ctx) as client:
        client.remove_node(name)
    out.print(f"node {escape(name)}: removed")


# -- queues ---------------------------------------------------------------------------

_QUOTA_HELP = "GPUs guaranteed while its jobs want them (none: what other queues leave)."
_BORROW_HELP = "Idle GPUs of other queues it may use beyond its quota (none: no limit)."


def _limit(value: str | None, flag: str) -> int | None | str:
    """A count, `none` (no value: null), or "" when the flag was not given."""
    if value is None:
        return ""
    if value.lower() == "none":
        return None
    if not value.isdigit():
        _fail(f"{flag} must be a number of GPUs or `none`, got {value!r}", EXIT_BAD_INPUT)
    return int(value)


def _queue_fields(
    quota: str | None,
    borrowing_limit: str | None,
    weight: float | None,
    parent: str | None,
    users: str | None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in (
        ("quota", _limit(quota, "--quota")),
        ("borrowing_limit", _limit(borrowing_limit, "--borrowing-limit")),
    ):
        if value != "":
            fields[key] = value
    if weight is not None:
        fields["weight"] = weight
    if parent is not None:
        fields["parent"] = None if parent.lower() == "none" else parent
    if users is not None:
        fields["users"] = [name.strip() for name in users.split(",") if name.strip()]
    return fields


def _gpus(value: Any) -> str:
    return "-" if value is None else str(value)


def _print_queue(queue: dict[str, Any]) -> None:
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column()
    for key, value in (
        ("queue", escape(str(queue.get("name")))),
        ("parent", escape(str(queue.get("parent") or "-"))),
        ("quota", _gpus(queue.get("quota")) + " GPU(s)"),
        ("borrowing limit", _gpus(queue.get("borrowing_limit"))),
        ("weight", str(queue.get("weight"))),
        ("users", escape(", ".join(queue.get("users") or []) or "everyone")),
        ("GPUs in use", f"{queue.get('gpus_in_use')} ({queue.get('borrowed_gpus')} borrowed)"),
        ("jobs", f"{queue.get('admitted_jobs')} admitted, {queue.get('pending_jobs')} pending"),
    ):
        info.add_row(key, value)
    out.print(info)


QueueArg = Annotated[str, typer.Argument(help="Queue name.", show_default=False)]
QuotaOpt = Annotated[str | None, typer.Option("--quota", help=_QUOTA_HELP)]
BorrowOpt = Annotated[str | None, typer.Option("--borrowing-limit", help=_BORROW_HELP)]
WeightOpt = Annotated[float | None, typer.Option(min=0.001, help="Fair-share weight.")]
ParentOpt = Annotated[str | None, typer.Option(help="Parent queue (`none`: top level).")]
UsersOpt = Annotated[
    str | None, typer.Option(help="Comma-separated users who may submit (empty: everyone).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@queue_app.command("list")
def queue_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Every queue: quota, borrowing, weight, and what its jobs use and wait for."""
    with _api(ctx) as client:
        page = client.queues()
    if as_json:
        _echo_json(page)
        return
    table = Table(box=None, header_style="bold")
    for column in ("QUEUE", "PARENT", "QUOTA", "BORROW", "WEIGHT", "IN USE", "BORROWED", "PENDING"):
        table.add_column(column)
    for queue in page.get("items", []):
        table.add_row(
            escape(str(queue.get("name"))),
            escape(str(queue.get("parent") or "-")),
            _gpus(queue.get("quota")),
            _gpus(queue.get("borrowing_limit")),
            str(queue.get("weight")),
            str(queue.get("gpus_in_use")),
            str(queue.get("borrowed_gpus")),
            str(queue.get("pending_jobs")),
        )
    out.print(table)


@queue_app.command("show")
def queue_show(ctx: typer.Context, name: QueueArg, as_json: JsonOpt = False) -> None:
    """One queue and its usage."""
    with _api(ctx) as client:
        queue = client.get_queue(name)
    if as_json:
        _echo_json(queue)
        return
    _print_queue(queue)


@queue_app.command("create")
def queue_create(
    ctx: typer.Context,
    name: QueueArg,
    quota: QuotaOpt = None,
    borrowing_limit: BorrowOpt = None,
    weight: WeightOpt = None,
    parent: ParentOpt = None,
    users: UsersOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a queue (admins)."""
    fields = _queue_fields(quota, borrowing_limit, weight, parent, users)
    with _api(ctx) as client:
        queue = client.create_queue({"name": name, **fields})
    if as_json:
        _echo_json(queue)
        return
    out.print(f"queue {escape(name)}: created")


@queue_app.command("edit")
def queue_edit(
    ctx: typer.Context,
    name: QueueArg,
    quota: QuotaOpt = None,
    borrowing_limit: BorrowOpt = None,
    weight: WeightOpt = None,
    parent: ParentOpt = None,
    users: UsersOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a queue's fields (admins); those not given stay."""
    fields = _queue_fields(quota, borrowing_limit, weight, parent, users)
    if not fields:
        _fail(
            "nothing to change: give --quota, --borrowing-limit, --weight, --parent or --users",
            EXIT_BAD_INPUT,
        )
    with _api(ctx) as client:
        queue = client.update_queue(name, fields)
    if as_json:
        _echo_json(queue)
        return
    _print_queue(queue)


@queue_app.command("delete")
def queue_delete(ctx: typer.Context, name: QueueArg) -> None:
    """Delete a queue no active job names (admins)."""
    with _api(ctx) as client:
        client.delete_queue(name)
    out.print(f"queue {escape(name)}: deleted")


# -- profile --------------------------------------------------------------------------

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d{1,3})?)$")
_TARGET = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(>=|<=)\s*([-+0-9.eE]+)\s*$")


def _parse_target(text: str) -> TargetMetric:
    match = _TARGET.fullmatch(text)
    if match is None:
        _fail(f"--target {text!r}: write NAME>=VALUE or NAME<=VALUE, e.g. accuracy>=0.9", 2)
    name, operator, value = match.groups()
    try:
        return TargetMetric(
            name=name, value=float(value), mode="max" if operator == ">=" else "min"
        )
    except (ValueError, ValidationError) as exc:
        _fail(f"--target {text!r}: {exc}", 2)


@app.command()
def profile(
    ctx: typer.Context,
    workload: Annotated[str, typer.Argument(help="Built-in name or package.module:Class.")],
    workers: Annotated[int, typer.Option(min=1, max=64, help="Data-parallel workers.")] = 4,
    batch_size: Annotated[int, typer.Option(min=1, help="Global batch size.")] = 128,
    stages: Annotated[
        int | None, typer.Option(min=1, help="Cut into this many stages (default: the trial's).")
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, max=100, help="Timed passes per figure.")] = 7,
    threads: Annotated[int, typer.Option(min=1, help="torch threads (an agent slot's).")] = 1,
    efficiency: Annotated[
        bool,
        typer.Option(help="Also train to --target under each SPB configuration (slow)."),
    ] = False,
    target: Annotated[
        str, typer.Option(help="Target of the efficiency runs: NAME>=VALUE or NAME<=VALUE.")
    ] = "accuracy>=0.9",
    max_iterations: Annotated[int, typer.Option(min=1, help="Limit of each run.")] = 1000,
    learning_rate: Annotated[float, typer.Option(help="Learning rate of the runs.")] = 0.05,
    device: Annotated[
        str,
        typer.Option(
            help="Measure the stages on `cpu` or a CUDA device (`cuda`, `cuda:N`); `auto`: "
            "this machine's first CUDA device if it has one (where an agent here runs jobs), "
            "else cpu. The efficiency runs train on CPU processes either way (steps do not "
            "depend on it)."
        ),
    ] = "auto",
    save: Annotated[bool, typer.Option(help="Store the profile through the API.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
) -> None:
    """Measure a workload's per-stage costs (and SPB's statistical price) on this machine."""
    try:
        checked_workload(workload)
        hyperparameters = Hyperparameters(batch_size=batch_size, learning_rate=learning_rate)
    except (ValueError, ValidationError) as exc:
        _fail(str(exc), 2)
    if batch_size < workers:
        _fail(f"--batch-size {batch_size} is smaller than --workers {workers}", 2)
    goal = _parse_target(target) if efficiency else None
    if _DEVICE.match(device) is None:
        _fail(f"--device {device!r}: write auto, cpu, cuda or cuda:N", 2)
    # torch is imported only by the commands that train.
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    from worker_agent.gpus import VIRTUAL_KIND
    from worker_agent.runtime.spb.efficiency import measure_profile, phases
    from worker_agent.runtime.spb.stages import StageError
    from worker_agent.runtime.timing import peak_memory_bytes, utilization_meter
    from worker_agent.runtime.workloads import WorkloadError

    measured_on = torch.device(device)
    device_kind = VIRTUAL_KIND  # what an agent's CPU slots report, so profiles match them
    if measured_on.type == "cuda":
        if not torch.cuda.is_available():
            _fail(f"--device {device}: torch {torch.__version__} sees no CUDA device here", 2)
        if measured_on.index is None:
            measured_on = torch.device("cuda", torch.cuda.current_device())
        if measured_on.index >= torch.cuda.device_count():
            _fail(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s)", 2)
        # The name agents report as the GPU's kind, so profiles match the nodes' GPUs.
        device_kind = torch.cuda.get_device_name(measured_on)
    torch.set_num_threads(threads)
    # On stderr even with --json: the efficiency runs take minutes.
    with StepProgress(err, workload, phases(goal)) as steps:
        # How busy the device is, and the memory it takes, while the stages are timed
        # (the first phase): what the scheduler packs a job by before it reports.
        meter = utilization_meter(measured_on)
        if measured_on.type == "cuda":
            torch.cuda.reset_peak_memory_stats(measured_on)
        utilization: list[float | None] = []
        peak: list[int] = []

        def on_phase(phase: str) -> None:
            if steps.begun == 1:
                utilization.append(meter.sample())
                peak.append(peak_memory_bytes(measured_on))
            steps.begin(phase)

        try:
            measured = measure_profile(
                workload,
                workers=workers,
                hyperparameters=hyperparameters,
                stages=stages,
                repeats=repeats,
                target=goal,
                max_iterations=max_iterations,
                device=measured_on,
                on_phase=on_phase,
            )
        except (StageError, WorkloadError) as exc:
            _fail(str(exc), 2)
        if not utilization:
            utilization.append(meter.sample())
            peak.append(peak_memory_bytes(measured_on))
    document = {
        **measured.to_json(),
        "device_kind": device_kind,
        "utilization": utilization[0],
        "peak_memory_bytes": peak[0],
    }
    if save:
        with _api(ctx) as client:
            client.put_profile(workload, {k: v for k, v in document.items() if k != "workload"})
    if as_json:
        _echo_json(document)
        return
    table = Table(
        title=f"{workload}: {workers} workers, {measured.per_worker_batch} per worker, "
        f"measured on {escape(device_kind)}"
    )
    for column in ("STAGE", "FORWARD ms", "dX ms", "dW ms", "ACTIVATIONS KiB", "PARAMS KiB"):
        table.add_column(column, justify="right")
    for index, stage in enumerate(measured.stages):
        table.add_row(
            str(index),
            f"{stage.forward_seconds * 1e3:.2f}",
            f"{stage.backward_input_seconds * 1e3:.2f}",
            f"{stage.backward_weight_seconds * 1e3:.2f}",
            f"{stage.activation_bytes / 1024:,.0f}",
            f"{stage.parameter_bytes / 1024:,.1f}",
        )
    out.print(table)
    for key, ratio in measured.steps_ratio.items():
        out.print(f"spb {key}: {ratio:.2f}x the steps of full backprop to {target}")
    if save:
        out.print("stored through the API")


@app.command("profiles")
def list_profiles(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the profiles as JSON.")] = False,
) -> None:
    """Stored model profiles (`jigsaw profile --save` adds them)."""
    with _api(ctx) as client:
        page = client.profiles()
    if as_json:
        _echo_json(page)
        return
    table = Table(header_style="bold")
    for column in ("WORKLOAD", "KEY", "STAGES", "PRICED", "MEASURED"):
        table.add_column(column)
    for item in page.get("items", []):
        profile = item.get("profile") or {}
        table.add_row(
            escape(str(item.get("workload"))),
            escape(str(item.get("key"))),
            str(len(profile.get("stages", []))),
            escape(", ".join(sorted(profile.get("steps_ratio", {}))) or "-"),
            _when(item.get("created_at")),
        )
    out.print(table)


# -- demo -----------------------------------------------------------------------------


@app.command()
def demo(
    home: Annotated[
        Path | None, typer.Option(help="State directory (default: a fresh temporary one).")
    ] = None,
    compare: Annotated[
        bool,
        typer.Option(help="Then run the same jobs under FIFO and compare (twice as long)."),
    ] = True,
) -> None:
    """Start a throwaway cluster (API, scheduler, 2 agents), train a few jobs, summarise."""
    from api.demo import DemoError, run_demo

    workdir = Path(home) if home else Path(tempfile.mkdtemp(prefix="jigsaw-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        unsuccessful = run_demo(out, workdir, _state, compare=compare)
    except (DemoError, ApiError) as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        _fail("interrupted")
    if unsuccessful:
        _fail(f"{unsuccessful} job(s) did not succeed; see `jigsaw job ID` and {workdir}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
