"""The Optuna study: storage, sampler, and the objective that runs one trial per config.

Failures are data.  A config that OOMs or hangs becomes a COMPLETE trial with constraint
`feasible` > 0 (Optuna 5 `trial.set_constraint`), so TPE and GP samplers learn where the
server dies.  FAIL is kept for the tuner's own faults, which teach the sampler nothing.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import sqlalchemy.exc
from optuna.trial import TrialState

from tuner import __version__
from tuner.errors import UsageError
from tuner.search.grid import grid_space
from tuner.search.objectives import Objective, slo_violations
from tuner.study.recovery import WORKER_ATTR, worker_id
from tuner.search.space import SearchSpace
from tuner.trial.run import TrialContext, TrialResult, run_trial

if TYPE_CHECKING:
    from tuner.trial.pipeline import AdaptivePipeline

SAMPLERS = ("auto", "gp", "tpe", "nsga2", "random", "grid")


def make_sampler(name: str, seed: int | None, n_trials: int,
                 space: SearchSpace | None = None) -> optuna.samplers.BaseSampler:
    """`auto`: multivariate TPE (constraint-aware).  benchmarks/search_efficiency.py measured it
    against GPSampler through the same pipeline at 20, 40 and 60 trials on the InfiniLM space:
    TPE reached a higher median share of the grid's best at every budget, at a tenth of the
    sampler's compute.  `grid` needs the space."""
    if name == "grid":
        if space is None:
            raise UsageError("--sampler grid needs the search space")
        return optuna.samplers.GridSampler(grid_space(space), seed=seed)
    if name == "auto":
        name = "tpe"
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=min(8, max(2, n_trials // 3)))
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                          n_startup_trials=min(10, max(2, n_trials // 3)))
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise UsageError(f"unknown sampler '{name}' (choose from {', '.join(SAMPLERS)})")


def storage_url(studies_dir: Path, name: str, storage: str | None) -> str:
    if storage:
        return storage
    return f"sqlite:///{(studies_dir / name / 'study.db').as_posix()}"


def open_storage(url: str, attempts: int = 5) -> optuna.storages.BaseStorage:
    """An RDB storage with a heartbeat, so trials of a killed worker can be found and retried.

    Workers started together on an empty database all create Optuna's tables; PostgreSQL lets
    one win and the others fail on a duplicate table or type.  Those try again (the tables are
    there by then); any other error is the user's URL and is reported at once.
    """
    race: Exception | None = None
    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(
                url, heartbeat_interval=10, grace_period=30,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3))
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as exc:
            race = exc
            time.sleep(0.2 * (attempt + 1))
        except Exception as exc:  # sqlalchemy raises many types for a bad or unreachable URL
            raise UsageError(f"cannot open storage {url}: {_first_line(exc)}") from None
    raise UsageError(f"cannot open storage {url}: {_first_line(race)}")


def _first_line(exc: Exception | None) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def run_seed(storage: optuna.storages.BaseStorage, name: str, seed: int,
             gpu_index: int | None) -> int:
    """The sampler seed of this run of this worker.

    Resumed with the same --seed, a sampler would replay the first run's proposals: configs
    already measured, copied instead of run, and the trial budget spent on copies.  So the seed
    moves on by the number of trials the study already holds (a new study keeps --seed as given),
    and each worker of `--gpus` gets its own stream.  Workers started by hand on several hosts
    need their own --seed each.
    """
    try:
        so_far = storage.get_n_trials(storage.get_study_id_from_name(name))
    except KeyError:
        so_far = 0
    return seed + so_far + 10_007 * (gpu_index or 0)


def create_or_load(name: str, storage: optuna.storages.BaseStorage, ctx: TrialContext,
                   objectives: list[Objective], sampler: optuna.samplers.BaseSampler,
                   gpu_desc: str) -> optuna.Study:
    """Create the study, or load it after checking it was made with the same space and goals."""
    directions = [o.direction for o in objectives]
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                directions=directions, load_if_exists=True)
    attrs = study.user_attrs
    fp = ctx.space.fingerprint()
    if attrs.get("space_fingerprint") not in (None, fp):
        raise UsageError(f"study '{name}' exists with a different search space "
                         f"({attrs.get('space_file')}); use another --study name")
    if attrs.get("objectives") not in (None, [o.label for o in objectives]):
        raise UsageError(f"study '{name}' exists with objectives {attrs.get('objectives')}; "
                         "use the same objectives or another --study name")
    if "space_fingerprint" not in attrs:
        space = ctx.space
        meta: dict[str, Any] = {
            "space": space.name, "space_file": str(space.path),
            "workload": ctx.workload.name, "model": ctx.model_dir, "gpu": gpu_desc,
            "simulated": ctx.simulate is not None, "objectives": [o.label for o in objectives],
            "slo": dict(ctx.workload.slo or {}), "tuner_version": __version__,
            "flag_params": {p.name: p.flag for p in space.parameters if p.flag},
            "env_params": {p.name: p.env for p in space.parameters if p.env},
            "launch_command": list(space.server.command),
        }
        for key, value in meta.items():  # the fingerprint last: it marks the record complete
            study.set_user_attr(key, value)
        study.set_user_attr("space_fingerprint", fp)
    return study


def config_key(params: dict[str, Any]) -> str:
    return hashlib.sha256(repr(sorted(params.items())).encode()).hexdigest()[:16]


def suggest(trial: optuna.Trial, ctx: TrialContext) -> dict[str, Any]:
    """Ask the sampler for one value per knob, through Optuna's public suggest API."""
    params: dict[str, Any] = {}
    for p in ctx.space.parameters:
        dist = p.distribution()
        if isinstance(dist, optuna.distributions.IntDistribution):
            params[p.name] = trial.suggest_int(p.name, dist.low, dist.high, step=dist.step, log=dist.log)
        elif isinstance(dist, optuna.distributions.FloatDistribution):
            params[p.name] = trial.suggest_float(p.name, dist.low, dist.high, step=dist.step, log=dist.log)
        else:
            params[p.name] = trial.suggest_categorical(p.name, dist.choices)
    return params


def counted(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that count towards the budget: finished, or being run by some worker."""
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))


@dataclass
class TrialObjective:
    """Callable handed to `study.optimize`: one trial = one server run.

    Several workers may share the study, so the budget is checked against the trials numbered
    before this one (numbers are handed out atomically by the storage), and a config that
    already completed is not run again: its result is copied.
    """

    ctx: TrialContext
    objectives: list[Objective]
    trials_dir: Path
    max_trials: int | None = None
    pipeline: AdaptivePipeline | None = None   # pre-screen, staging, confirm (tuner/pipeline.py)

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        study = trial.study
        trial.set_user_attr(WORKER_ATTR, worker_id())  # first: recovery finds dead workers by it
        if self.max_trials is not None:
            ahead = [t for t in counted(study) if t.number < trial.number]
            if len(ahead) >= self.max_trials:
                raise optuna.TrialPruned("the study's trial budget was reached by other workers")
        params = suggest(trial, self.ctx)
        key = config_key(params)
        trial.set_user_attr("config_key", key)
        done = _completed_with_key(study, key)
        if done is not None:
            return _copy_result(trial, done)
        trial_dir = self.trials_dir / str(trial.number)
        trial.set_user_attr("trial_dir", str(trial_dir))
        if self.pipeline is not None:
            result = self.pipeline.run(study, params, trial_dir)
        else:
            result = run_trial(self.ctx, params, trial_dir)
        return record(trial, result, self.objectives, self.ctx.workload.slo or {})


def _completed_with_key(study: optuna.Study, key: str) -> optuna.trial.FrozenTrial | None:
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("config_key") == key and "cached_from" not in t.user_attrs:
            return t
    return None


def _copy_result(trial: optuna.Trial, done: optuna.trial.FrozenTrial) -> tuple[float, ...]:
    """Tell the sampler the known result of a config it proposed again, without a server run."""
    for name, value in done.constraints.items():
        trial.set_constraint(name, value)
    for key, value in done.user_attrs.items():
        if key not in (WORKER_ATTR, "config_key", "trial_dir", "wall_s"):
            trial.set_user_attr(key, value)
    trial.set_user_attr("cached_from", done.number)
    return tuple(done.values)


def record(trial: optuna.Trial, result: TrialResult, objectives: list[Objective],
           slo: dict[str, float]) -> tuple[float, ...]:
    """Store what the trial saw and return the values Optuna gets."""
    outcome = result.outcome
    feasible = outcome.feasible
    trial.set_constraint("feasible", 0.0 if feasible else 1.0)
    violations = slo_violations(result.metrics, slo) if feasible else {m: 1.0 for m in slo}
    for metric, v in violations.items():
        trial.set_constraint(f"slo:{metric}", float(v))
    for name, v in result.constraints.items():
        trial.set_constraint(name, float(v))
    kind = outcome.kind
    if feasible and any(v > 0 for v in violations.values()):
        kind = "slo"
    trial.set_user_attr("outcome", kind)
    trial.set_user_attr("reason", outcome.reason)
    trial.set_user_attr("metrics", result.metrics)
    trial.set_user_attr("cells", result.cells)
    trial.set_user_attr("argv", result.argv)
    trial.set_user_attr("env", result.env)
    trial.set_user_attr("wall_s", round(result.wall_s, 3))
    for key, value in result.extra.items():
        trial.set_user_attr(key, value)
    if not feasible:
        return tuple(o.worst() for o in objectives)
    return tuple(o.value(result.metrics) for o in objectives)
