"""The head trained where it lives: flce.ServerOptimizer (flce.clip_grad_norm_, which
records its clip coefficient for the next step, is in flce.clip).

    head = flce.RemoteLMHead(client, "lm", session_id="run-1")
    head.load_from_module(model.lm_head)
    opt = head.optimizer("adamw", lr=3e-4, weight_decay=0.1)   # state created on the server
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    for x, y in batches:
        loss = head(model.body(x), y)
        loss.backward()                                        # grad_W accumulates there
        flce.clip_grad_norm_(model.parameters(), opt, 1.0)     # one global norm, head included
        body_opt.step(); opt.step(); sched.step()              # Step: no weight crosses the wire
        body_opt.zero_grad(); opt.zero_grad()

ServerOptimizer is a torch.optim.Optimizer over placeholder parameters, one per group
(weight, then bias when the head has one), so that lr schedulers drive its learning
rates. The moments live on the server; this object holds the hyper-parameters, the
learning rates and the step count. A server started with --checkpoint-dir saves the
head with its moments (opt.save_checkpoint(name)); the optimizer's state_dict() then
names that checkpoint, and load_state_dict() loads it back on the server:

    opt.save_checkpoint("run-1.step-1000")                    # head + moments, on the server
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict(), ...}, path)
    ...                                                        # later, or in a new process
    state = torch.load(path)
    head.load_checkpoint(state["opt"]["flce"]["checkpoint"])  # only if the server lost the head
    opt = head.optimizer("adamw", lr=3e-4, weight_decay=0.1, replace=True)
    opt.load_state_dict(state["opt"])                         # LoadCheckpoint, then lrs

Under torch.distributed (data parallel), every rank computes into ONE shared session;
every collective call (step, zero_grad, flce.clip_grad_norm_) is made on every rank:
the ranks meet at a barrier, rank 0 alone talks to the server, and its answer (or its
error) reaches every rank.
"""
from __future__ import annotations

import math
import uuid
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple, Union

import grpc
import torch
import torch.distributed as dist

from flce.client import Client, optimizer_kind
from flce.errors import FlceError
from flce.results import (CheckpointInfo, HeadInfo, OptimizerGroup, OptimizerInfo,
                          OptimizerKind, StepResult)


class TrainedHead(Protocol):
    """What a ServerOptimizer uses of its head: a flce.RemoteLMHead. This module does not
    import flce.module (which imports it to make a head's optimizer): the optimizer knows
    the head by these members alone."""
    client: Client
    head_id: str
    session_id: str
    _optimizer: Optional["ServerOptimizer"]  # set by the ServerOptimizer made for it
    _clip_coef: Optional[float]              # flce.clip_grad_norm_'s, for the next step
    _embed_found_inf: bool                   # a tied embedding's gradient was not finite

    def info(self) -> HeadInfo: ...

    def drain(self, timeout: Optional[float] = None) -> None: ...

    def zero_grad(self, set_to_none: bool = True) -> None: ...


# The hyper-parameters each kind keeps in its param_groups, with torch.optim's names.
_HYPER = {OptimizerKind.SGD: ("momentum", "dampening", "weight_decay", "nesterov"),
          OptimizerKind.ADAMW: ("betas", "eps", "weight_decay", "amsgrad")}
_DEFAULT_WEIGHT_DECAY = {OptimizerKind.SGD: 0.0, OptimizerKind.ADAMW: 1e-2}
_KIND_NAMES = {OptimizerKind.SGD: "sgd", OptimizerKind.ADAMW: "adamw"}


def _torch_refusal(kind: OptimizerKind, lr: float, hyper: Dict[str, Any]) -> None:
    """Raises what torch.optim raises for these hyper-parameters (same type, same message):
    the same values must be refused here as in a local optimizer."""
    probe = [torch.nn.Parameter(torch.zeros(1))]
    if kind == OptimizerKind.SGD:
        torch.optim.SGD(probe, lr=lr, **hyper)
    else:
        torch.optim.AdamW(probe, lr=lr, **hyper)


def _hyper_from_server(kind: OptimizerKind, group: OptimizerGroup) -> Dict[str, Any]:
    """A group's hyper-parameters as the server applies them, under torch's names."""
    if kind == OptimizerKind.SGD:
        return dict(momentum=group.momentum, dampening=group.dampening,
                    weight_decay=group.weight_decay, nesterov=group.nesterov)
    return dict(betas=(group.beta1, group.beta2), eps=group.eps,
                weight_decay=group.weight_decay, amsgrad=group.amsgrad)


def _group_message(kind: OptimizerKind, hyper: Dict[str, Any]) -> OptimizerGroup:
    if kind == OptimizerKind.SGD:
        return OptimizerGroup(weight_decay=float(hyper["weight_decay"]),
                              momentum=float(hyper["momentum"]),
                              dampening=float(hyper["dampening"]),
                              nesterov=bool(hyper["nesterov"]))
    beta1, beta2 = hyper["betas"]
    return OptimizerGroup(weight_decay=float(hyper["weight_decay"]), beta1=float(beta1),
                          beta2=float(beta2), eps=float(hyper["eps"]),
                          amsgrad=bool(hyper["amsgrad"]))


class _Ranks:
    """The ranks of a process group sharing one session: rank 0 calls the server."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if group is None:
            self.src = 0
        else:  # broadcasts name the source by its global rank
            get_global = getattr(dist, "get_global_rank", None) or \
                dist.distributed_c10d._get_global_rank
            self.src = get_global(group, 0)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def all_gather(self, value) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.group)
        return out

    def on_leader(self, what: str, fn: Callable[[], Any]) -> Any:
        """fn() on rank 0; its result on every rank. A failure is raised on every rank,
        so that no rank waits forever in the next collective: a FlceError as the same
        FlceError (a script's retry logic then runs on every rank alike)."""
        payload: List[Any] = [None]
        error: Optional[BaseException] = None
        if self.leader:
            try:
                payload[0] = ("ok", fn())
            except FlceError as err:
                error = err
                payload[0] = ("flce", (err.method, err.code.name, err.details, err.request_id))
            except Exception as err:  # noqa: BLE001 (re-raised below, on every rank)
                error = err
                payload[0] = ("error", f"{type(err).__name__}: {err}")
        dist.broadcast_object_list(payload, src=self.src, group=self.group)
        status, value = payload[0]
        if error is not None:
            raise error
        if status == "flce":
            method, code, details, request_id = value
            raise FlceError(method, grpc.StatusCode[code], details, request_id)
        if status == "error":
            raise RuntimeError(f"{what} failed on rank 0: {value}")
        return value


def _distributed_ranks(distributed: Optional[bool], process_group) -> Optional[_Ranks]:
    available = dist.is_available() and dist.is_initialized()
    if distributed is None:
        distributed = available and dist.get_world_size(process_group) > 1
    if not distributed:
        return None
    if not available:
        raise RuntimeError("distributed=True needs torch.distributed initialised "
                           "(init_process_group) first")
    return _Ranks(process_group)


class ServerOptimizer(torch.optim.Optimizer):
    """torch.optim.SGD or AdamW for a RemoteLMHead, run by the server on the head's session
    gradient. Create it with RemoteLMHead.optimizer(...).

    param_groups[0] is the weight's group, param_groups[1] the bias's (heads with a bias);
    each holds "lr" and the kind's hyper-parameters under torch's names, so lr schedulers
    work on it. Only the learning rates may change after creation: the server's state
    takes the other hyper-parameters once (a scheduler that cycles momentum or betas,
    such as OneCycleLR's default, is refused at step(); pass cycle_momentum=False).

    step() sends Step with the groups' learning rates, the clip coefficient recorded by
    flce.clip_grad_norm_ (then cleared), grad_multiplier and found_inf, under the request
    id "<run_id>-step-<k>" (k: steps this object has completed), so calling step() again
    after it failed retries the same step and never applies it twice. The result is
    `last_step` (a flce.StepResult). zero_grad() zeroes the session's gradient.

    A step on a session that holds no gradient (no compute call since the last step or
    zero_grad) changes nothing: last_step.outcome is StepOutcome.SKIPPED_NO_GRADIENT, as
    torch.optim skips a parameter whose grad is None.

    state_dict() holds the hyper-parameters, each group's lr, the step count, the head's
    version and the name of the server checkpoint last saved or loaded through this
    optimizer (or its head), but never the moments: those stay on the server.
    save_checkpoint(name) saves the head with its optimizer state there (a server
    started with --checkpoint-dir, capability "checkpoint"); load_state_dict() of a
    state naming a checkpoint loads it on the server (head, fp32 master, moments, step
    count), then restores the learning rates. A state without a checkpoint name restores
    the hyper-parameters and learning rates only; when they differ from those the
    server's state was created with, the state is created anew with them (moments start
    from zero)."""

    def __init__(self, head: TrainedHead, kind: Union[str, int], *, lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: Optional[float] = None, amsgrad: bool = False,
                 momentum: float = 0.0, dampening: float = 0.0, nesterov: bool = False,
                 bias_weight_decay: Optional[float] = None, replace: bool = False,
                 grad_multiplier: Optional[float] = None, run_id: Optional[str] = None,
                 distributed: Optional[bool] = None, process_group=None):
        kind = optimizer_kind(kind)
        name = _KIND_NAMES[kind]
        if kind == OptimizerKind.ADAMW:
            foreign = {"momentum": (momentum, 0.0), "dampening": (dampening, 0.0),
                       "nesterov": (nesterov, False)}
        else:
            foreign = {"betas": (tuple(betas), (0.9, 0.999)), "eps": (eps, 1e-8),
                       "amsgrad": (amsgrad, False)}
        for key, (value, default) in foreign.items():
            if value != default:
                raise ValueError(f"{key} is not a parameter of {name}")
        if weight_decay is None:
            weight_decay = _DEFAULT_WEIGHT_DECAY[kind]
        every = dict(momentum=momentum, dampening=dampening, nesterov=nesterov,
                     betas=tuple(betas), eps=eps, amsgrad=amsgrad, weight_decay=weight_decay)
        hyper = {k: every[k] for k in _HYPER[kind]}
        _torch_refusal(kind, lr, hyper)

        self.head = head
        self.kind = kind
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self._ranks = _distributed_ranks(distributed, process_group)
        if grad_multiplier is None:
            grad_multiplier = 1.0 / self._ranks.world_size if self._ranks else 1.0
        if not (math.isfinite(grad_multiplier) and grad_multiplier >= 0):
            raise ValueError(f"grad_multiplier must be finite and >= 0, got {grad_multiplier}")
        self.grad_multiplier = float(grad_multiplier)

        has_bias = head.info().has_bias
        if bias_weight_decay is not None and not has_bias:
            raise ValueError(f"head {head.head_id!r} has no bias: bias_weight_decay does not "
                             "apply")
        groups = [dict(params=[torch.nn.Parameter(torch.zeros(0))], name="weight", lr=lr,
                       **hyper)]
        if has_bias:
            bias_hyper = dict(hyper)
            if bias_weight_decay is not None:
                bias_hyper["weight_decay"] = bias_weight_decay
                _torch_refusal(kind, lr, bias_hyper)
            groups.append(dict(params=[torch.nn.Parameter(torch.zeros(0))], name="bias",
                               lr=lr, **bias_hyper))
        self._sealed = False
        super().__init__(groups, dict(lr=lr, **hyper))
        self._sealed = True

        self._step_calls = 0  # k of the next step's request id
        self._save_calls = 0  # k of the next save's request id
        self._pending_save: Optional[Tuple[str, bool, int]] = None  # a save that raised
        self.last_step: Optional[StepResult] = None
        self.head_version: Optional[int] = None
        self.steps = 0
        # the server checkpoint last saved or loaded through this optimizer or its head,
        # and the optimizer steps it holds
        self.checkpoint: Optional[str] = None
        self.checkpoint_steps: Optional[int] = None
        self._detached: Optional[str] = None  # why step() refuses (the server's state changed)
        if self._ranks is not None:
            self._check_ranks_agree()
        self._server_hyper: List[Dict[str, Any]] = []
        self.info: OptimizerInfo = self._create(replace)
        head._optimizer = self

    # ---------------------------------------------------------------- state --
    def _hyper_of(self, group: Dict[str, Any]) -> Dict[str, Any]:
        return {k: (tuple(group[k]) if k == "betas" else group[k]) for k in _HYPER[self.kind]}

    def _create(self, replace: bool) -> OptimizerInfo:
        hypers = [self._hyper_of(g) for g in self.param_groups]
        messages = [_group_message(self.kind, h) for h in hypers]

        def create() -> OptimizerInfo:
            return self.head.client.create_optimizer(
                self.head.head_id, self.kind, weight=messages[0],
                bias=messages[1] if len(messages) > 1 else None, replace=replace)

        info = self._ranks.on_leader("CreateOptimizer", create) if self._ranks else create()
        self._server_hyper = hypers
        self._detached = None
        self.steps = info.steps
        # the server's state is new: no checkpoint holds it
        self.checkpoint = self.checkpoint_steps = None
        return info

    def _check_ranks_agree(self) -> None:
        """Every rank must name the same head, session and hyper-parameters: a rank with
        its own session would have its gradients silently left out of every step."""
        mine = (self.head.head_id, self.head.session_id, int(self.kind),
                [self._hyper_of(g) for g in self.param_groups])
        seen = self._ranks.all_gather(mine)
        if any(other != seen[0] for other in seen):
            raise ValueError(
                "every rank must create the server optimizer for the same head and session "
                "with the same hyper-parameters (one shared session: give RemoteLMHead the "
                f"same session_id on every rank); got {seen}")

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if getattr(self, "_sealed", False):
            raise ValueError("a ServerOptimizer's groups are the head's weight and bias: no "
                             "other group can be added")
        super().add_param_group(param_group)

    def state_dict(self) -> Dict[str, Any]:
        """torch's state_dict (no "state": the moments live on the server) with "flce": the
        kind, the head, the step count, the head's version, and "checkpoint", the name of
        the server checkpoint last saved or loaded through this optimizer or its head (None
        if none), with "checkpoint_steps", the optimizer steps it holds. Take it right
        after save_checkpoint(), so that its learning rates are those of the checkpoint's
        step (load_state_dict() refuses a state taken steps later)."""
        sd = super().state_dict()
        sd["flce"] = dict(kind=_KIND_NAMES[self.kind], head_id=self.head.head_id,
                          run_id=self.run_id, step_calls=self._step_calls, steps=self.steps,
                          head_version=self.head_version,
                          grad_multiplier=self.grad_multiplier, checkpoint=self.checkpoint,
                          checkpoint_steps=self.checkpoint_steps)
        return sd

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restores the optimizer from a state_dict(). The run id stays this object's own and
        its step request ids never go back, so that new steps are never taken for replays
        of old ones.

        A state naming a server checkpoint (state_dict["flce"]["checkpoint"]) loads it on
        the server first (LoadCheckpoint with reset_optimizer: the head's weight, fp32
        master, moments and step count become the checkpoint's; every rank calls this
        under torch.distributed, rank 0 loads), then restores the learning rates; the
        step count and head version become the loaded head's (at least the saved
        version, and never one the head had before on that server). The state's
        hyper-parameters must be the checkpoint's (ValueError otherwise, after the load).
        A state taken steps after its checkpoint was saved ("steps" != "checkpoint_steps")
        is refused before anything is loaded: its learning rates are not the
        checkpoint's (set "checkpoint" to None to restore the learning rates alone). The
        sessions' gradients are not touched (zero_grad() drops one computed before the
        load).

        A state without a checkpoint name restores hyper-parameters and learning rates;
        when the hyper-parameters differ from those the server's state was created with,
        the state is created anew with them (moments start from zero)."""
        state_dict = dict(state_dict)
        extra = dict(state_dict.pop("flce", None) or {})
        if extra and extra.get("kind") != _KIND_NAMES[self.kind]:
            raise ValueError(f"this state is of a {extra.get('kind')} optimizer, not "
                             f"{_KIND_NAMES[self.kind]}")
        step_calls = max(self._step_calls, int(extra.get("step_calls", 0)))
        name = extra.get("checkpoint")
        if not name:
            super().load_state_dict(state_dict)
            self._sealed = True
            for group in self.param_groups:
                if "betas" in group:
                    group["betas"] = tuple(group["betas"])
                _torch_refusal(self.kind, group["lr"], self._hyper_of(group))
            self._step_calls = step_calls
            self.head_version = extra.get("head_version", self.head_version)
            if [self._hyper_of(g) for g in self.param_groups] != self._server_hyper:
                self.info = self._create(replace=True)
            return

        # Everything that can be checked is checked before the server loads anything.
        groups = [dict(g) for g in state_dict.get("param_groups", [])]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for group in groups:
            if "betas" in group:
                group["betas"] = tuple(group["betas"])
            _torch_refusal(self.kind, group["lr"], self._hyper_of(group))
        saved_steps, steps = extra.get("checkpoint_steps"), extra.get("steps")
        if saved_steps is not None and steps is not None and saved_steps != steps:
            raise ValueError(
                f"this state was taken {steps - saved_steps} steps after checkpoint "
                f"{name!r} was saved (steps {steps}, the checkpoint's {saved_steps}): its "
                "learning rates are not the checkpoint's. Take state_dict() right after "
                "save_checkpoint(), or set state_dict['flce']['checkpoint'] = None to restore "
                "the learning rates and hyper-parameters alone")

        def load() -> HeadInfo:
            return self.head.client.load_checkpoint(self.head.head_id, name,
                                                    reset_optimizer=True)

        if self._ranks is not None:
            self._ranks.barrier()  # no rank computes on the head while it is replaced
            info = self._ranks.on_leader("LoadCheckpoint", load)
        else:
            info = load()
        self._track_load(name, info)
        if self._detached is not None:
            raise ValueError(self._detached)
        hypers = [self._hyper_of(g) for g in groups]
        if hypers != self._server_hyper:
            raise ValueError(
                f"checkpoint {name!r} (now loaded on the server) holds the hyper-parameters "
                f"{self._server_hyper}, this state {hypers}: a state names the checkpoint "
                "saved with it")
        super().load_state_dict(state_dict)
        self._sealed = True
        for group in self.param_groups:
            if "betas" in group:
                group["betas"] = tuple(group["betas"])
        self._step_calls = step_calls

    # ----------------------------------------------------------- checkpoints --
    def save_checkpoint(self, name: str, *, overwrite: bool = False) -> CheckpointInfo:
        """Saves the head with this optimizer's state on the server (SaveCheckpoint: weight,
        bias, fp32 master, moments, step count, hyper-parameters, as <name>.safetensors in
        the caller's directory under --checkpoint-dir) and records the name for
        state_dict(). Save between steps: the sessions' gradients are not saved. An
        existing name is FlceError ALREADY_EXISTS unless overwrite.

        Retry-safe as step(): the save goes out under the request id
        "<run_id>-save-<k>"; when it raises, calling save_checkpoint() again with the same
        name and overwrite before any step sends the same request (the server answers with
        the first outcome, `replayed`, and writes nothing). Under torch.distributed every
        rank calls it, rank 0 saves."""
        key = (name, bool(overwrite), self._step_calls)
        if self._pending_save is not None and self._pending_save != key:
            self._save_calls += 1  # a save that raised may have reached the server
        self._pending_save = key
        request_id = f"{self.run_id}-save-{self._save_calls}"

        def save() -> CheckpointInfo:
            return self.head.client.save_checkpoint(self.head.head_id, name,
                                                    overwrite=overwrite, request_id=request_id)

        info = self._ranks.on_leader("SaveCheckpoint", save) if self._ranks else save()
        self._save_calls += 1
        self._pending_save = None
        self._track_save(info)
        return info

    def _track_save(self, info: CheckpointInfo) -> None:
        self.checkpoint = info.name
        self.checkpoint_steps = info.steps
        self.head_version = info.head_version

    def _track_load(self, name: str, info: HeadInfo) -> None:
        """The server's head is now checkpoint `name`: this object follows it."""
        self.head._clip_coef = None
        self.head_version = info.version
        self.checkpoint = name
        state = info.optimizer
        self.checkpoint_steps = self.steps = state.steps if state is not None else 0
        self._detached = None
        if state is None:
            self._detached = (f"checkpoint {name!r} holds no optimizer state: head "
                              f"{self.head.head_id!r} has none now")
        elif state.kind != self.kind:
            theirs = _KIND_NAMES.get(state.kind, state.kind.name.lower())
            self._detached = (f"checkpoint {name!r} holds {theirs} state, not "
                              f"{_KIND_NAMES[self.kind]}: create a {theirs} optimizer for "
                              f"head {self.head.head_id!r}")
        elif info.has_bias != (len(self.param_groups) > 1):
            self._detached = (f"checkpoint {name!r} is of a head "
                              f"{'with' if info.has_bias else 'without'} a bias, this "
                              f"optimizer {'has no' if info.has_bias else 'has a'} bias group")
        if state is not None:
            self.info = state
            if state.kind == self.kind:
                groups = [state.weight] + ([state.bias] if len(self.param_groups) > 1 else [])
                self._server_hyper = [_hyper_from_server(state.kind, g) for g in groups]

    # ----------------------------------------------------------------- steps --
    def _check_hyper(self) -> None:
        if self._detached is not None:
            raise ValueError(self._detached)
        for group, server in zip(self.param_groups, self._server_hyper):
            now = self._hyper_of(group)
            changed = {k: (server[k], now[k]) for k in now if now[k] != server[k]}
            if changed:
                raise ValueError(
                    f"the {group['name']} group's {', '.join(changed)} differ from the "
                    f"server's optimizer state's ({changed}: the server's, now): the server "
                    "takes only learning rates per step. For OneCycleLR pass "
                    "cycle_momentum=False; or create the state anew with "
                    "head.optimizer(..., replace=True)")

    @property
    def request_id(self) -> str:
        """The request id the next step() sends (a retry after a failure sends it again)."""
        return f"{self.run_id}-step-{self._step_calls}"

    def step(self, closure: Optional[Callable[[], Any]] = None, *,
             found_inf: bool = False, expected_head_version: Optional[int] = None):
        """Applies the session's gradient on the server (every rank calls it under
        torch.distributed; rank 0 sends the Step). found_inf (a GradScaler's overflow)
        skips the step and drops the gradient, as does a tied flce.RemoteEmbedding's
        gradient that was not finite (RemoteEmbedding.found_inf, any rank's under
        torch.distributed); a session that holds no gradient is skipped
        (StepOutcome.SKIPPED_NO_GRADIENT: no weight decay, no moment update, as torch.optim
        skips a parameter whose grad is None). Returns the closure's loss, as torch's
        optimizers do; the outcome is `last_step`."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.head.drain()  # the head's submitted calls land first (flce.pipeline)
        self._check_hyper()
        coef = self.head._clip_coef
        if coef is not None and not math.isfinite(coef):
            # the global norm overflowed: where torch would write NaN into the weights,
            # the step is skipped and the gradient dropped
            coef, found_inf = None, True
        # a tied flce.RemoteEmbedding's gradient was not finite (it was not sent): the
        # session lacks it, so the step is skipped as the server skips a non-finite one
        embed_found_inf = bool(self.head._embed_found_inf)
        groups = self.param_groups
        bias_lr = groups[1]["lr"] if len(groups) > 1 else None
        request_id = self.request_id

        def send() -> StepResult:
            return self.head.client.step(
                self.head.head_id, groups[0]["lr"], session_id=self.head.session_id,
                bias_lr=bias_lr, clip_coef=coef,
                grad_multiplier=self.grad_multiplier if self.grad_multiplier != 1.0 else None,
                found_inf=found_inf, request_id=request_id,
                expected_head_version=expected_head_version)

        if self._ranks is not None:
            # every rank's contributions have landed; any rank's embedding overflow counts
            if any(self._ranks.all_gather(embed_found_inf)):
                found_inf = True
            result = self._ranks.on_leader("Step", send)
        else:
            found_inf = found_inf or embed_found_inf
            result = send()
        self.head._clip_coef = None
        self.head._embed_found_inf = False
        self._step_calls += 1
        self.last_step = result
        self.head_version = result.head_version
        self.steps = result.steps
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 (torch's API)
        """Zeroes the session's gradient on the server (a Step already leaves it zero)."""
        self.head.drain()
        if self._ranks is not None:
            # no rank may be computing into the session while it is zeroed
            self._ranks.barrier()
            self._ranks.on_leader("ZeroGrad", self.head.zero_grad)
        else:
            self.head.zero_grad()
        self.head._clip_coef = None
        self.head._embed_found_inf = False
