"""The ``quantize-serve`` command line: how a platform team drives the pipeline from CI.

    quantize-serve validate RECIPE...      every recipe and input check; exit 0 (all valid) or 2
    quantize-serve plan (RECIPE | --model DIR_OR_HUB_ID) [--gpu h200|h100-80gb|BYTES] [--tp N]
                        [--max-model-len N] [--kv-cache-dtype D] [--enforce-eager | --cudagraph-memory SIZE]
    quantize-serve plan RECIPE --measure [--out DIR] [--tp N] ...
                                           the same table measured: vLLM boots the shape with dummy
                                           weights (config.json and tokenizer only) on this machine
    quantize-serve run RECIPE [--verbose]  the flow, locally: a line per stage, then the decision
                                           (the full log in the run folder's run.log; --verbose
                                           streams it too)
    quantize-serve releases REPO           the release history from the Hub, as a table
    quantize-serve rollback REPO [--to SHA]
                                           the release ref back to an earlier gated commit (the
                                           rollback flow, locally)

A mistake in the input (``quantize_serve.core.errors.USER_ERRORS``: a recipe problem, a Hub repo or token
the Hub refuses) prints one screen, each problem with its fix, and exits 2 without a traceback;
``--debug`` prints the traceback too. Other failures the pipeline names (a Hub outage, a failed
boot) print one screen and exit 1; anything else is a bug and keeps its traceback.

``validate`` and ``plan`` import neither Prefect nor torch (nor ``datasets``); ``plan --measure``
boots vLLM. ``run`` checks the recipe and its inputs the same way before it imports Prefect, so a
bad recipe fails in a fraction of a second and no temporary Prefect server starts.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import re
import shutil
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from quantize_serve.capacity import plan_table, planner
from quantize_serve.capacity import shape as shape_capacity
from quantize_serve.console import decision_lines, run_console, shown_path, terminal_handlers
from quantize_serve.core.errors import USER_ERRORS, QuantizeServeError, RecipeError, RecipeErrors
from quantize_serve.core.settings import get_settings
from quantize_serve.hub.client import resolve_token
from quantize_serve.hub.download import fetch_model_config
from quantize_serve.local_api import start_local_api
from quantize_serve.recipe.inputs import check_model, check_model_config, read_model_config, show_path
from quantize_serve.recipe.load import load_recipe
from quantize_serve.recipe.section import looks_local
from quantize_serve.release.history import release_history
from quantize_serve.release.rollback import RollbackRequest, plan_rollback
from quantize_serve.report.run_report import RunReport, report_of
from quantize_serve.serving import gpu
from quantize_serve.validate.preflight import check_recipe, check_serving_host, for_this_host, model_shape_dir

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
DEFAULT_GPU = "h200"
DEFAULT_PLAN_MAX_MODEL_LEN = 8192  # benchmarks/plan.py's; capped at the model's max_position_embeddings
DEBUG_HINT = "(--debug prints the traceback)"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``quantize-serve`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        return command(args)
    except USER_ERRORS as exc:
        return report_failure(exc, debug=args.debug, status=EXIT_INPUT)
    except QuantizeServeError as exc:
        return report_failure(exc, debug=args.debug, status=EXIT_FAILED)


def build_parser() -> argparse.ArgumentParser:
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the traceback of an error as well",
    )
    parser = argparse.ArgumentParser(
        prog="quantize-serve",
        parents=[debug],
        description="Quantize an LLM, prove it on vLLM, gate it and release it on the Hugging Face Hub.",
    )
    parser.set_defaults(debug=False)
    sub = parser.add_subparsers(dest="name", required=True, metavar="{validate,plan,run,releases,rollback}")

    p = sub.add_parser(
        "validate",
        parents=[debug],
        help="check recipes and their inputs (no heavy imports)",
        description="Run every recipe and input check without starting anything: the "
        "recipe's fields and cross-section rules, the local model folder's files and "
        "config.json, the calibration data's field and row count. Exit 0 when all are "
        "valid, 2 otherwise.",
    )
    p.add_argument("recipes", nargs="+", metavar="RECIPE", help="recipe YAML file(s)")
    p.add_argument(
        "--remote",
        action="store_true",
        help="also fetch a Hub model's config.json (one small download) and check it",
    )
    p.set_defaults(command=validate_command)

    p = sub.add_parser(
        "plan",
        parents=[debug],
        help="print the capacity planner's table",
        description="Predict weights, KV cache and batch capacity of the base, W4A16 and "
        "W4A16 + fp8 KV configurations from config.json alone (quantize_serve/capacity/planner.py).",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "recipe", nargs="?", metavar="RECIPE", help="plan the recipe's model and serve settings"
    )
    what.add_argument(
        "--model",
        metavar="DIR_OR_HUB_ID",
        help="a model folder, a config.json, or a Hub repo id (only its config.json is fetched)",
    )
    p.add_argument("--revision", help="Hub branch, tag or commit of --model")
    p.add_argument(
        "--gpu",
        type=_gpu,
        metavar="h200|h100-80gb|BYTES",
        help=f"device memory: a preset or a size (default: on a host without a GPU, the recipe's "
        f"serve.memory_budget if set; else {DEFAULT_GPU})",
    )
    p.add_argument("--tp", type=_positive_int, metavar="N", help="tensor parallel size")
    p.add_argument("--max-model-len", type=_positive_int, metavar="N")
    p.add_argument("--max-num-batched-tokens", type=_positive_int, metavar="N")
    p.add_argument("--gpu-memory-utilization", type=_fraction, metavar="F")
    p.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        help="KV dtype of the production row (default: the recipe's, else fp8)",
    )
    graphs = p.add_mutually_exclusive_group()
    graphs.add_argument(
        "--enforce-eager",
        action="store_true",
        default=None,
        help="plan vLLM without CUDA graphs (default: the recipe's serve.enforce_eager, else "
        "graphs on, as vLLM serves by default)",
    )
    graphs.add_argument(
        "--cudagraph-memory",
        type=_byte_size,
        metavar="SIZE",
        help="CUDA-graph memory vLLM takes from the KV budget per GPU, e.g. 0.72GiB: the "
        "'(estimated)' figure of a boot's 'CUDA graph pool memory' line (default: the planner's "
        "own, which follows vLLM 0.26: none under its V2 model runner, dense models; a per-layer "
        "estimate under its V1 runner, most MoE architectures)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of a table")
    p.add_argument(
        "--measure",
        action="store_true",
        help="measure instead of predict: boot vLLM on this machine with dummy weights of the "
        "model's shape (only config.json and the tokenizer are fetched) for the three "
        "configurations, with the recipe's serve settings (RECIPE required; --gpu not allowed)",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="--measure: folder for shape-capacity.json/.md/.png and the vLLM logs "
        "(default: QS_WORK_DIR/plans/<recipe name>)",
    )
    p.set_defaults(command=plan_command)

    p = sub.add_parser(
        "run",
        parents=[debug],
        help="run the pipeline on a recipe, locally",
        description="Check the recipe, then run the quantize-serve flow with a local, "
        "temporary Prefect API. Exit 0 when the release is promoted, 1 when it is "
        "rejected or a stage fails, 2 when the input is wrong. It prints a line as each "
        "stage starts and ends and the decision at the end; the full log (Prefect's task "
        "logs, lm-eval's and llm-compressor's output) goes to run.log in the run's folder.",
    )
    p.add_argument("recipe", metavar="RECIPE")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="stream the full log to the terminal as well (it still goes to run.log)",
    )
    p.set_defaults(command=run_command)

    hub_options = argparse.ArgumentParser(add_help=False)
    hub_options.add_argument("repo", metavar="REPO", help="the Hub repo of the releases (org/name)")
    hub_options.add_argument(
        "--ref", default="production", help="the release ref (the recipe's hub.release_ref)"
    )
    hub_options.add_argument(
        "--ref-kind",
        choices=("tag", "branch"),
        default="tag",
        help="the release ref's kind (the recipe's hub.release_ref_kind)",
    )
    hub_options.add_argument(
        "--token-env",
        default="HF_TOKEN",
        metavar="VAR",
        help="the environment variable holding the Hub token (never the token itself)",
    )
    p = sub.add_parser(
        "releases",
        parents=[debug, hub_options],
        help="the release history of a repo, from the Hub",
        description="Every gated commit of REPO (and every rejected candidate), newest first: "
        "its decision, recoveries, capacity, who approved it, when it was promoted or rolled "
        "back, and where the release ref points now. Reads the Hub only.",
    )
    p.add_argument("--json", action="store_true", help="print the history as JSON instead of a table")
    p.set_defaults(command=releases_command)

    p = sub.add_parser(
        "rollback",
        parents=[debug, hub_options],
        help="move the release ref back to a gated commit",
        description="Point the release ref of REPO at an earlier gated commit (--to SHA; "
        "default: the newest gated commit older than the current one; from a rejected candidate, the "
        "one `quantize-serve releases` proposes, which a ref at a commit never gated must name), "
        "note it on the card "
        "and emit the Prefect event quantize-serve.release.rolled-back (the rollback flow, run "
        "locally). Idempotent. A commit that was never gated or was rejected is refused "
        "(exit 2) before anything changes; a ref someone else moved in between is refused "
        "too (exit 1).",
    )
    p.add_argument("--to", metavar="SHA", help="the gated commit to go back to (full or at least 7 digits)")
    p.add_argument("--reason", default="", help="why: noted on the card and in the event")
    p.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    p.set_defaults(command=rollback_command)
    return parser


# --------------------------------------------------------------------------------------------
# validate
# --------------------------------------------------------------------------------------------


def validate_command(args: argparse.Namespace) -> int:
    statuses = []
    for path in args.recipes:
        try:
            check = check_recipe(path, remote=args.remote)
        except USER_ERRORS as exc:
            statuses.append(report_failure(exc, debug=args.debug, status=EXIT_INPUT, hint=False))
            continue
        except QuantizeServeError as exc:  # --remote and the Hub is away: not the recipe's fault
            statuses.append(report_failure(exc, debug=args.debug, status=EXIT_FAILED, hint=False))
            continue
        statuses.append(EXIT_OK)
        offline = " offline" if check.not_checked else ""
        print(f"{check.source}: valid{offline} ({'; '.join(check.checked)})")
        for note in check.not_checked:
            print(f"  not checked: {note}")
    if len(statuses) > 1:
        valid = statuses.count(EXIT_OK)
        print(
            f"{valid} of {len(statuses)} recipes valid",
            file=sys.stdout if valid == len(statuses) else sys.stderr,
        )
    if any(statuses) and not args.debug:
        print(DEBUG_HINT, file=sys.stderr)
    return EXIT_INPUT if EXIT_INPUT in statuses else max(statuses)


# --------------------------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------------------------


def plan_command(args: argparse.Namespace) -> int:
    if args.measure:
        return measure_command(args)

    recipe = None
    if args.recipe:
        recipe, config, model = _recipe_model(args.recipe)
        recipe = _on_this_host(recipe)
    else:
        config, model = _model_config(args.model, revision=args.revision), args.model
    shape = planner.ModelShape.from_config(config, source=_config_source(model))
    serve, quant = (recipe.serve, recipe.quantization) if recipe else (None, None)
    utilization = args.gpu_memory_utilization or (serve.gpu_memory_utilization if serve else 0.90)
    if args.gpu is not None:
        mode, memory, block = "gpu", args.gpu, planner.BLOCK_SIZE_GPU
    elif serve is not None and serve.memory_budget is not None:
        # the CPU runs' accounting (quantize_serve/capacity/measure.py): every configuration shares the budget
        mode, memory, block, utilization = (
            "fixed_budget",
            int(serve.memory_budget),
            planner.BLOCK_SIZE_CPU,
            1.0,
        )
    else:
        mode, memory, block = "gpu", planner.GPU_MEMORY_BYTES[DEFAULT_GPU], planner.BLOCK_SIZE_GPU
    table = plan_table.plan_table(
        shape,
        device_memory_bytes=memory,
        gpu_memory_utilization=utilization,
        max_model_len=args.max_model_len
        or (serve.max_model_len if serve else min(DEFAULT_PLAN_MAX_MODEL_LEN, shape.max_position_embeddings)),
        max_num_batched_tokens=args.max_num_batched_tokens
        or (serve.batched_tokens if serve else planner.DEFAULT_MAX_NUM_BATCHED_TOKENS),
        block_size=block,
        tensor_parallel_size=args.tp or (serve.tensor_parallel_size if serve else 1),
        mode=mode,
        quant_scheme=quant.scheme if quant else "W4A16",
        fp8_kv_cache_dtype=args.kv_cache_dtype or (serve.kv_cache_dtype if serve else "fp8"),
        group_size=quant.group_size if quant else 128,
        ignore=tuple(quant.ignore) if quant else ("lm_head",),
        enforce_eager=bool(args.enforce_eager or (serve.enforce_eager if serve else False)),
        cudagraph_memory_bytes=args.cudagraph_memory,
        model=model,
        kv_offload=serve.kv_offload if serve else None,
    )
    print(table.model_dump_json(indent=2) if args.json else plan_table.format_table(table))
    return EXIT_OK


def measure_command(args: argparse.Namespace) -> int:
    """``plan RECIPE --measure``: shape_capacity.measure_shape with the recipe's serve settings, the
    plan options given on the command line applied as recipe overrides."""
    if not args.recipe or args.gpu is not None:
        problem = (
            "needs a RECIPE (its serve settings are what vLLM boots)"
            if not args.recipe
            else ("measures the GPU it runs on; --gpu only applies to a prediction")
        )
        raise RecipeError(
            "--measure",
            "--measure",
            "--model" if not args.recipe else "--gpu",
            problem,
            "run `quantize-serve plan RECIPE --measure [--tp N]`, or drop --measure to predict",
        )
    overrides = {
        f"serve.{key}": value
        for key, value in {
            "tensor_parallel_size": args.tp,
            "max_model_len": args.max_model_len,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "kv_cache_dtype": args.kv_cache_dtype,
        }.items()
        if value is not None
    }
    recipe = load_recipe(args.recipe, overrides)
    check_serving_host(recipe, source=args.recipe)
    device = gpu.usable_memory_bytes()
    recipe = _on_this_host(recipe, device)
    if device is None and recipe.serve.memory_budget is None:
        raise RecipeError(
            args.recipe,
            "serve.memory_budget",
            None,
            "no GPU here, and no CPU memory budget",
            "run on the GPU host, or set serve.memory_budget (e.g. 2GiB) to measure on CPU",
        )
    shape_dir = model_shape_dir(recipe)
    check_model_config(recipe, json.loads((shape_dir / "config.json").read_text()), source=args.recipe)
    out = args.out or get_settings().work_dir / "plans" / recipe.name
    result = shape_capacity.measure_shape(
        recipe, shape_dir, out_dir=out, model=recipe.model.id, device_memory_bytes=device, log=print
    )
    shape_capacity.write_files(result, out)
    print(result.model_dump_json(indent=2) if args.json else result.markdown())
    return EXIT_OK


def _on_this_host(recipe: Any, device_memory_bytes: int | None = None) -> Any:
    """The recipe as this host applies it (preflight.for_this_host), each setting it does not apply said
    on stderr (a --json plan stays parseable)."""
    device = gpu.usable_memory_bytes() if device_memory_bytes is None else device_memory_bytes
    recipe, not_applied = for_this_host(recipe, device)
    for field, why in not_applied.items():
        print(f"{field} not applied: {why}", file=sys.stderr)
    return recipe


def _recipe_model(path: str) -> tuple[Any, dict[str, Any], str]:
    """The recipe, its base model's config.json (checked against the recipe), and the model's name."""
    recipe = load_recipe(path)
    if recipe.model_is_local:
        return recipe, check_model(recipe, recipe.path(recipe.model.id), source=path), recipe.model.id
    config = _hub_config(
        recipe.model.id,
        revision=recipe.model.revision,
        token_env=recipe.hub.token_env if recipe.hub else "HF_TOKEN",
    )
    check_model_config(recipe, config, source=path)
    return recipe, config, recipe.model.id


def _config_source(model: str) -> str:
    """How a message names the config.json of ``model`` (a folder, a .json file or a Hub repo id)."""
    return model if model.endswith(".json") else f"{model.rstrip('/')}/config.json"


def _model_config(model: str, *, revision: str | None) -> dict[str, Any]:
    folder = Path(model).expanduser()
    if folder.is_file() and folder.suffix == ".json":  # a config.json on its own
        return (
            read_model_config(folder.parent)
            if folder.name == "config.json"
            else json.loads(folder.read_text())
        )
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise RecipeError(
                "--model",
                "--model",
                model,
                f"{show_path(folder)} holds no config.json",
                "pass a Hugging Face model folder (it has a config.json) or a Hub repo id",
            )
        return read_model_config(folder)
    if looks_local(model):
        raise RecipeError(
            "--model",
            "--model",
            model,
            "no such folder, and not a Hub repo id",
            "pass a model folder that exists, or a Hub repo id such as org/name",
        )
    return _hub_config(model, revision=revision, token_env="HF_TOKEN")


def _hub_config(repo_id: str, *, revision: str | None, token_env: str) -> dict[str, Any]:
    return fetch_model_config(
        repo_id, revision=revision, token=os.environ.get(token_env) or None, token_env=token_env
    )


# --------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------


def run_command(args: argparse.Namespace) -> int:
    check = check_recipe(args.recipe)  # a user error stops here, before Prefect is imported
    check_serving_host(check.recipe, source=check.source)
    for note in check.not_checked:
        print(f"{check.source}: not checked yet: {note}")
    from prefect.logging.handlers import PrefectConsoleHandler

    from flows.pipeline import run_local

    if not args.debug:
        quiet_user_tracebacks()
    print(f"quantize-serve run {check.source}", flush=True)
    handlers = terminal_handlers((PrefectConsoleHandler,))
    with run_console(verbose=args.verbose, handlers=handlers) as stages:
        start_local_api(say=stages.print)  # once, before the flow: a first start migrates the database
        state = run_local(args.recipe)
    if not args.verbose:
        quiet_prefect_server_notes(handlers)
    result = report_of(state.result(raise_on_failure=False))  # passed or rejected: its report
    if isinstance(result, RunReport):
        release = result.release
        print(
            f"decision: {'passed' if result.decision.passed else 'failed'}; "
            f"release: {release.status if release else 'n/a'}"
            + (
                f" ({release.ref} -> {(release.commit_sha or '')[:12]})"
                if release and release.status == "promoted"
                else ""
            )
        )
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        print("\n".join(decision_lines(result.decision, width=width)))
        print(
            f"report: {shown_path(Path(result.report_dir) / 'report.md')}"
            + (f"; full log: {shown_path(stages.log_path)}" if stages.log_path else "")
        )
        return EXIT_OK if state.is_completed() else EXIT_FAILED
    if isinstance(result, USER_ERRORS):
        return report_failure(result, debug=args.debug, status=EXIT_INPUT)
    if isinstance(result, QuantizeServeError):
        return report_failure(result, debug=args.debug, status=EXIT_FAILED)
    print(f"quantize-serve: the run ended {state.type.value}: {state.message}", file=sys.stderr)
    return EXIT_FAILED


# --------------------------------------------------------------------------------------------
# releases, rollback
# --------------------------------------------------------------------------------------------


def _rollback_request(args: argparse.Namespace, **more: Any) -> RollbackRequest:
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # reading each release's small record draws no bar on the terminal
    return RollbackRequest(
        repo_id=args.repo,
        release_ref=args.ref,
        release_ref_kind=args.ref_kind,
        token_env=args.token_env,
        **more,
    )


def releases_command(args: argparse.Namespace) -> int:
    """The history, read from the Hub (no Prefect)."""
    hub = _rollback_request(args).hub(source="quantize-serve releases")
    history = release_history(hub, token=resolve_token(hub))
    print(history.model_dump_json(indent=1) if args.json else history.table())
    return EXIT_OK


def rollback_command(args: argparse.Namespace) -> int:
    """Plan here (a refusal is one screen, exit 2, before Prefect starts), then run the rollback flow
    on the planned target; the flow reads the Hub again and moves the ref only from where it points."""
    request = _rollback_request(args, to=args.to, reason=args.reason)
    hub = request.hub(source="quantize-serve rollback")
    plan = plan_rollback(release_history(hub, token=resolve_token(hub)), args.to)
    print(plan.summary())
    if args.dry_run or plan.changes_nothing:
        return EXIT_OK
    from flows.rollback import rollback_release

    if not args.debug:
        quiet_user_tracebacks()
    start_local_api()
    state = rollback_release(request.model_copy(update={"to": plan.target}), return_state=True)
    result = state.result(raise_on_failure=False)
    if isinstance(result, BaseException):
        status = EXIT_INPUT if isinstance(result, USER_ERRORS) else EXIT_FAILED
        return report_failure(result, debug=args.debug, status=status)
    print(
        f"rolled back: {hub.release_ref_kind} {hub.release_ref!r} -> {plan.target}"
        + (f"; noted on the card in {result.note_commit[:12]}" if result.note_commit else "")
    )
    print(release_history(hub, token=resolve_token(hub)).table())
    return EXIT_OK


class _WithoutUserTraceback(logging.Formatter):
    """Formats like the wrapped formatter, minus the traceback of a user error (its message already
    says what to fix). Formats a copy, so other handlers (the run's API logs) keep the traceback."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info and isinstance(record.exc_info[1], USER_ERRORS):
            record = copy.copy(record)
            record.exc_info, record.exc_text = None, None
        return self.inner.format(record)


def quiet_user_tracebacks() -> None:
    """Prefect's console handler prints the traceback of whatever ends a task or a flow; for a user
    error the CLI prints the one-screen message instead. The Prefect run still fails with it."""
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [
        logging.getLogger(),
        *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)),
    ]
    for lg in loggers:
        for handler in lg.handlers:
            if isinstance(handler, PrefectConsoleHandler) and not isinstance(
                handler.formatter, _WithoutUserTraceback
            ):
                handler.setFormatter(_WithoutUserTraceback(handler.formatter))


class _NoServerNotes(logging.Filter):
    """Drops the notes of Prefect's own logger ("Stopping temporary server ..." when the process exits,
    after the run's lines and its log are done); its warnings still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "prefect" and record.levelno < logging.WARNING)


def quiet_prefect_server_notes(handlers: Sequence[logging.Handler]) -> None:
    for handler in handlers:
        if not any(isinstance(f, _NoServerNotes) for f in handler.filters):
            handler.addFilter(_NoServerNotes())


# --------------------------------------------------------------------------------------------
# One screen per failure
# --------------------------------------------------------------------------------------------


def report_failure(exc: BaseException, *, debug: bool, status: int, hint: bool = True) -> int:
    """Print one screen for ``exc`` (the traceback first with --debug); return ``status``."""
    if debug:
        traceback.print_exception(exc)
    print(render_error(exc), file=sys.stderr)
    if hint and not debug:
        print(DEBUG_HINT, file=sys.stderr)
    return status


def render_error(exc: BaseException) -> str:
    """The problems, each with its fix; recipe problems grouped by file."""
    if not isinstance(exc, (RecipeError, RecipeErrors)):
        return f"quantize-serve: {exc}"
    errors = exc.errors if isinstance(exc, RecipeErrors) else [exc]
    by_source: dict[str, list[RecipeError]] = {}
    for e in errors:
        by_source.setdefault(e.source, []).append(e)
    lines = []
    for source, errs in by_source.items():
        lines.append(f"{source}: {len(errs)} problem{'s' if len(errs) > 1 else ''}")
        for e in errs:
            lines.extend(_render_one(e))
    return "\n".join(lines)


def _render_one(e: RecipeError) -> list[str]:
    where = re.search(r"at line (\d+), column (\d+)", e.problem)
    if e.field == "<yaml>" and where:  # the offending line, with a caret under the column
        line, column = int(where.group(1)), int(where.group(2))
        gutter = f"{line} | "
        return [
            f"  {e.problem}",
            f"    {gutter}{e.value}",
            f"    {' ' * (len(gutter) - 2)}| {' ' * (column - 1)}^",
            f"    fix: {e.fix}",
        ]
    value = "{...}" if e.value == "{...}" else repr(e.value)  # a whole section: its keys are not the point
    value = value if len(value) <= 80 else value[:77] + "..."
    return [f"  {e.field} = {value}: {e.problem}", f"    fix: {e.fix}"]


# --------------------------------------------------------------------------------------------
# Argument types
# --------------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in (0, 1]")
    return value


def _byte_size(text: str) -> int:
    """A memory size: bytes (``770703360``) or with a unit (``0.72GiB``, ``735MiB``)."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        return int(TypeAdapter(ByteSize).validate_python(text.strip()))
    except ValidationError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a memory size (e.g. 0.72GiB or 770703360)"
        ) from None


def _gpu(text: str) -> float:
    try:
        return plan_table.gpu_memory_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


if __name__ == "__main__":
    raise SystemExit(main())
