"""Shoal from Python: any PyTorch training loop joins a Shoal run.

    import shoal
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with shoal.Worker(model, coordinator="127.0.0.1:50051") as worker:
        for x, y in loader:                    # your data, your loss
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if not worker.step(loss):           # the round's steps end here
                break                           # the run is over

The worker joins the run when it is made (a late joiner gets the run's current
model first), takes part in every round the coordinator plans, and leaves the
run when it is closed (the `with` block ends, Ctrl-C, the process exits).
`worker.step()` counts the loop's steps: when the round's local steps are done
it hands the model to Shoal, which averages it with the other members' in
place (the module's float32 CPU tensors are views of Shoal's buffer; bf16,
fp16 and CUDA tensors train against float32 master values in it) and gives it
back for the next round. With --overlap=on the loop trains the next round
while the last is averaged, and takes the average between two steps. See
docs/PYTHON.md.

Install it with `pip install --no-build-isolation .` at the repository's
root (or use PYTHONPATH=build/python after `make build`).
`shoal.__version__` names the version and the commit it was built from
("0.9.0+g1665085"); `python3 -m shoal --version` prints it.
"""

import atexit
import copy
import dataclasses
import hashlib
import json
import logging
import math
import signal
import sys
import threading
import weakref
from types import CodeType, FrameType, TracebackType
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Literal, NoReturn, Optional,
                    Sequence, Tuple, Type, Union)

import torch
import torch.utils.data

from . import _shoal

try:
    from ._version import __commit__, __version__
except ImportError:  # a package without its build's _version.py
    __version__ = "unknown"
    __commit__ = "unknown"

__all__ = ["Error", "Worker", "Optimizer", "Sampler", "RunStatus", "MemberStatus", "LedgerStatus",
           "flatten_module"]

_log = logging.getLogger("shoal")


class Error(RuntimeError):
    """A Shoal failure, with its gRPC status: `code` is the status name
    ("FAILED_PRECONDITION", "UNAUTHENTICATED", ...), `grpc_code` its number,
    `message` the reason. str(e) is "CODE: message"."""

    def __init__(self, grpc_code: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.grpc_code: int = grpc_code
        self.code: str = code
        self.message: str = message


def _error(e: "_shoal.StatusError") -> Error:
    return Error(*e.args)


# ------------------------------------------------------------------ the module


# Elements a sync moves at a time: the temporaries of a cast are bounded by
# this, not by the tensor or the model.
_CHUNK = 1 << 22


@dataclasses.dataclass
class _Entry:
    name: str
    tensor: torch.Tensor
    offset: int
    numel: int
    # "view": a float32 CPU tensor, now a view of the flat buffer (no copy
    # ever); "cast": a floating-point tensor of another dtype or device,
    # whose float32 master values the flat buffer holds; "int": an integer
    # buffer mirrored as float32 elements (rounded back).
    kind: str

    @property
    def declared_dtype(self) -> str:
        # The layout is the flat buffer's: a bf16 module declares what an
        # fp32 module of the same architecture declares.
        return str(self.tensor.dtype).replace("torch.", "") if self.kind == "int" else "float32"


def flatten_module(module: torch.nn.Module) -> Tuple[torch.Tensor, List[_Entry]]:
    """Moves the module's state_dict into one flat float32 tensor, Shoal's.

    Float32 parameters and buffers on the CPU become views of it (the
    optimizer keeps the same Parameter objects), one tensor at a time, so
    that the process holds the model once plus one tensor, never twice.
    Floating-point tensors of another dtype (bfloat16, float16, float64) or
    on another device (CUDA) stay the module's own: the buffer holds their
    float32 master values, which the Worker syncs with them between turns.
    Other buffers (BatchNorm's num_batches_tracked) are mirrored as float32
    elements. The order is the C++ worker's: trainable parameters, frozen
    parameters, floating-point buffers, the rest. Returns (flat, entries):
    the buffer and, per state_dict entry in that order, where it lies in
    it. Raises ValueError for tied weights, meta tensors, integer
    parameters and a module with nothing to train. shoal.Worker calls it;
    call it yourself only to see the layout."""
    state = module.state_dict(keep_vars=True)
    params = dict(module.named_parameters())
    seen: Dict[int, str] = {}
    trainable, frozen, float_buffers, others = [], [], [], []
    for name, t in state.items():
        if id(t) in seen:
            raise ValueError(
                f"tensor '{name}' is the same tensor as '{seen[id(t)]}' (tied weights); "
                "Shoal averages each state_dict entry on its own: untie them")
        seen[id(t)] = name
        if t.device.type == "meta":
            raise ValueError(f"tensor '{name}' is on the meta device: it holds no values")
        if name in params:
            if not t.is_floating_point():
                raise ValueError(
                    f"parameter '{name}' is {str(t.dtype)[6:]}; Shoal trains floating-point "
                    "parameters")
            (trainable if t.requires_grad else frozen).append((name, t))
        elif t.is_floating_point():
            float_buffers.append((name, t))
        else:
            others.append((name, t))
    ordered = trainable + frozen + float_buffers + others
    if not ordered:
        raise ValueError("the module has no parameters or buffers to train")
    total = sum(t.numel() for _, t in ordered)
    # Not zeroed: its pages are touched tensor by tensor below, as each
    # original is let go.
    flat = torch.empty(total, dtype=torch.float32)
    entries: List[_Entry] = []
    offset = 0
    with torch.no_grad():
        for name, t in ordered:
            n = t.numel()
            view = flat[offset:offset + n]
            if not t.is_floating_point():
                kind = "int"
            elif t.dtype == torch.float32 and t.device.type == "cpu":
                kind = "view"
            else:
                kind = "cast"
            if kind == "cast" and t.is_contiguous():
                source = t.detach().view(-1)
                for a in range(0, n, _CHUNK):
                    view[a:a + _CHUNK].copy_(source[a:a + _CHUNK])
            else:
                view.copy_(t.detach().reshape(-1))
            if kind == "view":
                t.data = view.view(t.shape)  # the original's memory goes now
            entries.append(_Entry(name, t, offset, n, kind))
            offset += n
    return flat, entries


def _hash_buffer(flat: torch.Tensor) -> str:
    """SHA-256 (hex) of a float32 CPU tensor's bytes, read in place (the
    worker's HashParameters)."""
    return hashlib.sha256(memoryview(flat.numpy()).cast("B")).hexdigest()


def _layers(entries: List[_Entry]) -> List[Tuple[str, List[int], str, int, int]]:
    return [(e.name, list(e.tensor.shape), e.declared_dtype, e.offset, e.numel) for e in entries]


class _Sync:
    """Syncs the module's tensors that are not views (bf16, fp16, CUDA,
    integer buffers) with the flat buffer, which holds their float32 master
    values, at the edges of the turns (external_trainer.h).

    pull: the module takes the buffer (cast per tensor).
    push: the buffer takes the module's progress since its pull, as a
    float32 delta: flat += float(t) - float(cast(flat)). The buffer is not
    written between a pull and the push, so cast(flat) is what the module
    started from: no copy of it is kept, and the master keeps the bits the
    module's dtype cannot hold. A chunk of a tensor at a time."""

    def __init__(self, flat: torch.Tensor, entries: List[_Entry]) -> None:
        self.flat = flat
        self.cast = [e for e in entries if e.kind == "cast"]
        self.ints = [e for e in entries if e.kind == "int"]

    def __bool__(self) -> bool:
        return bool(self.cast or self.ints)

    @staticmethod
    def _chunks(
            e: _Entry) -> Iterator[Tuple[torch.Tensor, Optional[torch.Size], Tuple[int, int]]]:
        # (module part, master part) pairs of at most _CHUNK elements; a
        # tensor that is not contiguous goes whole.
        if e.tensor.is_contiguous():
            module = e.tensor.detach().view(-1)
            for a in range(0, e.numel, _CHUNK):
                yield module[a:a + _CHUNK], None, (a, min(e.numel, a + _CHUNK))
        else:
            yield e.tensor.detach(), e.tensor.shape, (0, e.numel)

    def pull(self) -> None:
        with torch.no_grad():
            for e in self.cast:
                for part, shape, (a, b) in self._chunks(e):
                    src = self.flat[e.offset + a:e.offset + b]
                    part.copy_(src if shape is None else src.view(shape))
            for e in self.ints:
                src = self.flat[e.offset:e.offset + e.numel]
                e.tensor.copy_(src.round().view(e.tensor.shape).to(e.tensor.dtype))

    def push(self) -> None:
        with torch.no_grad():
            for e in self.cast:
                for part, shape, (a, b) in self._chunks(e):
                    master = self.flat[e.offset + a:e.offset + b]
                    delta = part.to(device="cpu", dtype=torch.float32, copy=True).reshape(-1)
                    delta -= master.to(e.tensor.dtype).to(torch.float32)
                    master += delta
            for e in self.ints:
                self.flat[e.offset:e.offset + e.numel].copy_(
                    e.tensor.detach().reshape(-1).to(torch.float32))


# ------------------------------------------------------------------ status


@dataclasses.dataclass
class MemberStatus:
    """One worker of the run, as the coordinator sees it: its `id` ("w3"),
    `name`, the Peer `address`, its `state` ("training", "sharing", ...
    while a member; "left", "lost", "finished" or "evicted" after), the
    round of the model it holds (`model_round`), the figures it last
    reported (`train_loss`, `test_accuracy`) and the `reason` it left or was
    removed."""
    id: str
    name: str
    address: str
    state: str
    model_round: int
    train_loss: float
    test_accuracy: float
    reason: str


@dataclasses.dataclass
class LedgerStatus:
    """The sample ledger of a run that keeps one (--sample_ledger,
    docs/DATA.md), as `shoalctl status` prints it: the training set's size
    (`dataset_samples`), the `epoch` fresh samples come from and the
    `offset` of the next one in it, `epochs_done`, samples trained into
    completed rounds (`samples_trained`), lost (`samples_lost`: their
    worker was killed, evicted, left or sat out) and trained again
    (`samples_redone`), lost ones waiting to be trained again
    (`samples_waiting`), and those the open round trains
    (`samples_in_flight`)."""
    dataset_samples: int
    epoch: int
    offset: int
    epochs_done: int
    samples_trained: int
    samples_lost: int
    samples_redone: int
    samples_waiting: int
    samples_in_flight: int

    @staticmethod
    def from_dict(d: Dict[str, Any]) -> "LedgerStatus":
        """The ledger from GetRunStatus's `ledger` (proto field names)."""
        return LedgerStatus(
            dataset_samples=int(d.get("dataset_samples", 0)), epoch=int(d.get("epoch", 0)),
            offset=int(d.get("offset", 0)), epochs_done=int(d.get("epochs_done", 0)),
            samples_trained=int(d.get("samples_trained", 0)),
            samples_lost=int(d.get("samples_lost", 0)),
            samples_redone=int(d.get("samples_redone", 0)),
            samples_waiting=sum(int(r.get("count", 0)) for r in d.get("pool", [])),
            samples_in_flight=int(d.get("samples_in_flight", 0)))


@dataclasses.dataclass
class RunStatus:
    """The run, from the coordinator (GetRunStatus, as `shoalctl status`
    shows it): `run_id`, `phase` ("WAITING_FOR_MEMBERS", "TRAINING",
    "SHARING", "FINISHED"), the open `round` and the `last_completed_round`,
    the agreed `model_hash`, the number of `members` and one MemberStatus
    per worker in `workers`; `ledger`, the epoch's progress in a run with
    the sample ledger (None without).
    `raw` holds every field of the reply as a dict (proto field names)."""
    run_id: str
    phase: str
    round: int
    last_completed_round: int
    model_hash: str
    members: int
    workers: List[MemberStatus]
    raw: Dict[str, Any]
    ledger: Optional[LedgerStatus] = None

    @staticmethod
    def from_json(text: str) -> "RunStatus":
        """The status from GetRunStatus's JSON (proto field names)."""
        d = json.loads(text)
        workers = [
            MemberStatus(id=w.get("id", ""), name=w.get("name", ""),
                         address=w.get("address", ""), state=w.get("state", ""),
                         model_round=int(w.get("model_round", 0)),
                         train_loss=float(w.get("train_loss", 0.0)),
                         test_accuracy=float(w.get("test_accuracy", 0.0)),
                         reason=w.get("reason", ""))
            for w in d.get("workers", [])
        ]
        return RunStatus(run_id=d.get("run_id", ""), phase=d.get("phase", ""),
                         round=int(d.get("round", 0)),
                         last_completed_round=int(d.get("last_completed_round", 0)),
                         model_hash=d.get("model_hash", ""), members=int(d.get("members", 0)),
                         workers=workers, raw=d,
                         ledger=LedgerStatus.from_dict(d["ledger"]) if d.get("ledger") else None)


# ------------------------------------------------------------------ logging


class _LogPump:
    """Hands the C++ side's log lines to Python's `logging` ("shoal" logger),
    from a thread of its own: no C++ thread ever calls into Python."""

    _lock = threading.Lock()
    _thread: Optional[threading.Thread] = None
    _stop = threading.Event()
    _levels = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.CRITICAL}

    @classmethod
    def start(cls) -> None:
        with cls._lock:
            if cls._thread is not None:
                return
            _shoal.install_log_queue()
            cls._stop.clear()
            cls._thread = threading.Thread(target=cls._run, name="shoal-log", daemon=True)
            cls._thread.start()

    @classmethod
    def _emit(cls, lines: List[Tuple[int, str]]) -> None:
        for level, message in lines:
            _log.log(cls._levels.get(level, logging.INFO), "%s", message)

    @classmethod
    def _run(cls) -> None:
        while not cls._stop.is_set():
            cls._emit(_shoal.next_log_lines(0.2))

    @classmethod
    def flush(cls) -> None:
        cls._emit(_shoal.next_log_lines(0.0))

    @classmethod
    def stop(cls) -> None:
        with cls._lock:
            if cls._thread is None:
                return
            cls._stop.set()
            cls._thread.join(timeout=2)
            cls._thread = None
            _shoal.remove_log_queue()
        cls.flush()


# ------------------------------------------------------------------ the worker

_live: "weakref.WeakSet[Worker]" = weakref.WeakSet()


class Worker:
    """A member of a Shoal run that trains `module` in this process's loop.

    Making it joins the run (the first member declares the module's layout;
    a module whose layout differs is refused with the first differing
    tensor's name) and waits until the module holds the run's current model:
    a late joiner pulls it from several members before its first step. It
    raises `shoal.Error` when the run cannot be joined.

    Arguments are shoal-worker's flags: `coordinator` (one address, or the
    replicas' addresses separated by commas), `name`, `listen` (the Peer
    service's address; port 0 picks one), `advertise`, `zone`, `token_file`,
    `tls_cert`, `tls_key`, `tls_ca`, `tls_server_name`, `outbound_only`,
    `metrics_listen`, `connect_timeout` and `rpc_timeout` (seconds),
    `uplink_mbps` (this machine's uplink: the exchange's connections are
    paced to fit it; 0 = unpaced; docs/OVERLAP.md), `shard_size` (the
    samples of this worker's shard, for the checkpoints' epoch count;
    0 = unknown), and `train_samples` (the size of the whole training set,
    len(dataset): a run with the sample ledger needs it, the same on every
    worker, and sampler() uses it).

    `step` and `optimizer` (together): hand Shoal the loop's step, so that
    it can train with run() and replay another member's round in an audited
    run (--audit_rate; docs/PYTHON.md, "Audits"). `step(module, batch,
    optimizer)` trains one batch (forward, loss, backward, optimizer step)
    and returns the loss; `optimizer(parameters)` makes the optimizer.
    An audited run refuses a worker that gave neither.

        with shoal.Worker(model, "10.0.0.1:50051", name="a") as w:
            x, y = x[w.rank % w.shards::w.shards], y[w.rank % w.shards::w.shards]
            while w.running:
                ...                     # a step of your loop
                if not w.step(loss):    # after optimizer.step()
                    break
                if w.new_round:
                    w.report(accuracy)  # the averaged model's figures

    Or let the worker choose the samples (the sample ledger's, in a run
    that keeps one: docs/PYTHON.md, "The sample ledger"):

        with shoal.Worker(model, "10.0.0.1:50051", train_samples=len(x)) as w:
            for xb, yb in w.batches((x, y)):   # until the run is over
                ...                             # a step of your loop
                w.step(loss)

    Attributes (set once joined):
        module        the module it trains (its tensors are in Shoal's buffer)
        address       the Peer service's address ("127.0.0.1:40211")
        worker_id     this worker's id in the run ("w3")
        rank, shards  this worker's data rank and the run's number of shards
        local_steps   steps per round (the run's --local_steps)
        batch_size    the run's --batch_size (samples a step, with the ledger)
        ledger        True when the run keeps a sample ledger (--sample_ledger)
        train_samples the training set's size given (0: not given)
        gossip        True in gossip mode (--mode=gossip): a turn is a step
        config        the run's configuration, a dict (RunConfig as JSON)
        new_round     True right after the step() that ended a round's steps

    Or hand Shoal the step (needed in an audited run):

        def train_step(model, batch, opt):
            x, y = batch
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        with shoal.Worker(model, "10.0.0.1:50051", train_samples=len(x), step=train_step,
                          optimizer=lambda p: torch.optim.SGD(p, lr=0.05)) as w:
            w.run((x, y))                       # until the run is over

    Methods: step(loss) after each optimizer step; run(dataset); sampler() and
    batches(dataset) (the samples to train: the ledger's, or this worker's
    shard); report(accuracy, loss);
    agreed() and model_hash(); status() (the run, from the coordinator);
    result() (why the run ended for it); close(reason). Properties:
    running, round, rounds. Failures raise shoal.Error.
    """

    def __init__(self, module: torch.nn.Module, coordinator: str = "127.0.0.1:50051", *,
                 name: str = "", listen: str = "127.0.0.1:0", advertise: str = "",
                 zone: str = "", token_file: str = "", tls_cert: str = "", tls_key: str = "",
                 tls_ca: str = "", tls_server_name: str = "", outbound_only: bool = False,
                 metrics_listen: str = "", connect_timeout: float = 60.0,
                 rpc_timeout: float = 10.0, uplink_mbps: float = 0.0,
                 shard_size: int = 0, train_samples: int = 0,
                 step: Optional["StepFn"] = None,
                 optimizer: Optional["OptimizerFactory"] = None) -> None:
        self._closed = True
        if (step is None) != (optimizer is None):
            raise ValueError("step and optimizer go together: run() and an audit's replay make "
                             "a fresh optimizer with optimizer(parameters) and train with "
                             "step(module, batch, optimizer)")
        self._step_fn = step
        self._make_optimizer = optimizer
        self.module: torch.nn.Module = module
        self._flat, self._entries = flatten_module(module)
        self._sync = _Sync(self._flat, self._entries)
        options = dict(coordinator=coordinator, listen=listen, advertise=advertise, name=name,
                       zone=zone, outbound_only=outbound_only, metrics_listen=metrics_listen,
                       connect_timeout=float(connect_timeout), rpc_timeout=float(rpc_timeout),
                       uplink_mbps=float(uplink_mbps),
                       token_file=token_file, tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca,
                       tls_server_name=tls_server_name, train_samples=int(train_samples),
                       replay_step=_replay_digest(module, step, optimizer) if step else "")
        if train_samples < 0:
            raise ValueError(f"train_samples must be >= 0, got {train_samples}")
        #: The training set's size given (train_samples; 0: not given).
        self.train_samples: int = int(train_samples)
        _LogPump.start()
        try:
            self._native = _shoal.Worker(options, self._flat.data_ptr(), self._flat.numel(),
                                         _layers(self._entries), int(shard_size))
            self.address: str = self._native.start()
        except _shoal.StatusError as e:
            raise _error(e) from None
        self._closed = False
        _live.add(self)
        self._losses: List[float] = []
        self._turn = 0  # steps of the open turn (0: the run is over)
        self._taken = 0
        self._push = True  # the open turn ends with a push
        self._local = False  # turns are steps of a local model (overlap, fragments)
        self._round = 0  # the round of the open turn's steps
        self._rounds = 0
        # The ledger's samples of the open training turn (a ledger run), the
        # number of that turn, the turn whose samples went to an iterator
        # and how many of them it gave out so far.
        self._samples: List[int] = []
        self._ledger_turn = False
        self._turn_number = 0
        self._handed = 0
        self._drawn = 0
        self._passes = 0  # epochs of the shard sampled (without a ledger)
        # run(): the loop is in it, and its dataset (for replays); the
        # replays' copy of the module (module, flat buffer, sync), made at
        # the first replay.
        self._in_run = False
        self._dataset: Optional[Tuple[int, Callable[[torch.Tensor], Any]]] = None
        self._replica: Optional[Tuple[torch.nn.Module, torch.Tensor, _Sync]] = None
        self._audited = False
        #: True right after the step() that ended a round's steps: the next
        #: round's begin. Without overlap or fragments the module now holds
        #: the averaged model of the round before `round` (evaluate it now);
        #: with them, the local model (docs/PYTHON.md, "Overlap and fragments").
        self.new_round: bool = False
        info = None
        try:
            self._turn = self._await_turn()
            if self._turn == 0:
                self._raise_result("the run ended before this worker's first step")
            info = self._native.info()
        except BaseException:
            self.close()
            raise
        self.worker_id: str = self._native.worker_id()
        self.config: Dict[str, Any] = json.loads(info["config"]) if info["config"] else {}
        training = self.config.get("training", {})
        #: This worker's data rank and the run's number of shards: train on
        #: the samples i with i % shards == rank % shards (or any split).
        self.rank: int = int(info["data_rank"])
        self.shards: int = max(1, int(training.get("data_shards", 1)))
        self.local_steps: int = int(training.get("local_steps", 1))
        #: The run's batch size (--batch_size): with the sample ledger each
        #: step trains a batch of this many of the round's samples.
        self.batch_size: int = max(1, int(training.get("batch_size", 64)))
        #: True when the run keeps a sample ledger (--sample_ledger): each
        #: round's samples come from the coordinator (sampler(), batches()).
        self.ledger: bool = bool(training.get("sample_ledger", False))
        self._seed = int(training.get("seed", 0))
        self.gossip: bool = "gossip" in self.config
        trust = self.config.get("trust", {})
        #: True in an audited run (--audit_rate): every round starts from a
        #: fresh optimizer and a seeded generator, and run() trains it.
        self.audited: bool = float(trust.get("audit_rate", 0)) > 0 and not self.gossip
        self._audited = self.audited
        if self.audited:
            # A replay must reduce in the same order as the round it replays.
            torch.set_num_threads(max(1, int(trust.get("audit_threads", 1))))
            _log.info("audited run: rounds start from a fresh optimizer and torch's generator "
                      "seeded from the round; %d torch thread(s)", torch.get_num_threads())
        _log.info("joined as %s at %s: %d tensors, %d elements, %s", self.worker_id, self.address,
                  len(self._entries), self._flat.numel(),
                  "gossip" if self.gossip else f"{self.local_steps} local steps a round")

    # -- the loop's side

    def step(self, loss: Optional[Union[torch.Tensor, float]] = None) -> bool:
        """Call once after each optimizer step. When the turn's steps are
        done (a round's local steps; one step in gossip mode) the module goes
        to Shoal and comes back averaged. False once the run is over for this
        worker (it finished, or was removed: see `result`).

        `loss` (a tensor or a number, optional): the step's training loss;
        the round's mean goes to the run's status. With --overlap=on or
        --fragments, each step is a turn and returns at once (docs/PYTHON.md,
        "Overlap and fragments")."""
        self.new_round = False
        if self._closed or self._turn == 0:
            return False
        if self._audited and not self._in_run:
            raise Error(9, "FAILED_PRECONDITION",
                        "this run is audited (--audit_rate): train with w.run(dataset), which "
                        "steps with the step and optimizer given to shoal.Worker, so that another "
                        "member can replay the round (docs/PYTHON.md, \"Audits\")")
        if loss is not None:
            self._losses.append(float(loss.detach()) if torch.is_tensor(loss) else float(loss))
        self._taken += 1
        if self._taken < self._turn:
            return True
        if self._ledger_turn:
            self._check_samples_trained()
        self._end_turn()
        self._turn = self._await_turn()
        return self._turn > 0

    def run(self, dataset: Any, on_round: Optional[Callable[["Worker"], None]] = None) -> int:
        """Trains with the step and optimizer given to the Worker until the
        run is over for this worker; returns the rounds trained.

            w.run((train_x, train_y), on_round=lambda w: w.report(evaluate(model)))

        `dataset` is what batches() takes (a tensor, a tuple of tensors, a
        TensorDataset, a map-style Dataset): each step trains a batch of the
        samples batches() gives (the ledger's in a ledger run), as
        `step(module, batch, optimizer)`. The optimizer is made once with
        `optimizer(module.parameters())`; in an audited run, once per round,
        after torch's generator is seeded from the run's seed and the round
        and the module is put in training mode, which is what a replay of the
        round does. `on_round(worker)` is called after each step that ended
        a round (w.new_round: the module holds the averaged model then,
        without overlap: evaluate and report() it there; put the module back
        in training mode if you change it)."""
        if self._step_fn is None or self._make_optimizer is None:
            raise ValueError("run() needs the step and the optimizer: "
                             "shoal.Worker(..., step=fn, optimizer=factory)")
        self._dataset = _fetcher(dataset)
        opt: Optional[torch.optim.Optimizer] = None
        turn = -1
        self._in_run = True
        try:
            for batch in self.batches(dataset):
                if opt is None or (self._audited and turn != self._turn_number):
                    turn = self._turn_number
                    opt = self._start_round(self.module, self._round)
                going = self.step(self._step_fn(self.module, batch, opt))
                if self.new_round and on_round is not None:
                    on_round(self)
                if not going:
                    break
        finally:
            self._in_run = False
        return self._rounds

    def _start_round(self, module: torch.nn.Module, round_: int) -> torch.optim.Optimizer:
        """A round's start in run() and in a replay of it: in an audited run,
        the generator seeded from the round and the module training."""
        assert self._make_optimizer is not None
        if self._audited:
            torch.manual_seed(_round_seed(self._seed, round_))
            module.train()
        return self._make_optimizer(module.parameters())

    def _replay(self, round_: int, samples: List[int], batch: int, steps: int) -> str:
        """An audit: trains a copy of the module from the round's base on
        `samples` as run() trained round `round_`; its hash. The loop's own
        generator state is put back after."""
        if self._step_fn is None:
            raise RuntimeError("this worker was given no step to replay")
        if self._dataset is None:
            raise RuntimeError("the loop has not called w.run(dataset) yet")
        n, fetch = self._dataset
        if samples and max(samples) >= n:
            raise RuntimeError(f"sample {max(samples)} is past the dataset's {n}")
        if self._replica is None:
            replica = copy.deepcopy(self.module)
            flat, entries = flatten_module(replica)
            self._replica = (replica, flat, _Sync(flat, entries))
        replica, flat, sync = self._replica
        self._native.copy_replay_base(flat.data_ptr(), flat.numel())
        sync.pull()
        rng = torch.get_rng_state()
        try:
            opt = self._start_round(replica, round_)
            order = torch.tensor(samples, dtype=torch.int64)
            for k in range(steps):
                self._step_fn(replica, fetch(order[k * batch:(k + 1) * batch]), opt)
        finally:
            torch.set_rng_state(rng)
        sync.push()
        return _hash_buffer(flat)

    def report(self, accuracy: float, loss: float = 0.0) -> None:
        """Test-set figures of the current model (accuracy in 0..1, the test
        loss), shown in the run's status with the next round."""
        self._native.report(float(accuracy), float(loss))

    def sampler(self) -> "Sampler":
        """The samples this worker trains, as a torch Sampler:

            loader = DataLoader(dataset, sampler=w.sampler(), batch_size=w.batch_size)
            while w.running:
                for x, y in loader:
                    ...                      # a step
                    if not w.step(loss):
                        break

        In a run with the sample ledger, each pass over it gives the samples
        of the round the steps train now, which the coordinator named (every
        sample exactly once per epoch, across kills and joins): the
        DataLoader's batch_size must be the run's (`w.batch_size`), a batch a
        step, and every batch trained and followed by step(). Without a
        ledger, each pass is an epoch of this worker's shard (the indices i
        with i % shards == rank % shards), shuffled. Needs `train_samples`
        (the training set's size) given to the Worker."""
        if self.train_samples <= 0:
            raise ValueError("sampler() needs the training set's size: "
                             "shoal.Worker(..., train_samples=len(dataset))")
        return Sampler(self)

    def batches(self, dataset: Any, batch_size: Optional[int] = None) -> Iterator[Any]:
        """Batches of `dataset` to train, until the run is over for this
        worker: call step() once after each (its optimizer step).

            for x, y in w.batches((train_x, train_y)):
                loss = F.cross_entropy(model(x), y)
                ...
                w.step(loss)

        `dataset`: a tensor, a tuple or list of tensors of one length
        (batches are index_select()s of them), a TensorDataset, or any
        map-style Dataset (its items are collated like a DataLoader's).
        `batch_size`: the run's (`w.batch_size`) by default; in a run with the
        sample ledger it must be the run's, since the coordinator hands out
        local_steps x batch_size samples a round, a batch a step. The
        samples are those of sampler(): the ledger's for the round being
        trained, or epochs of this worker's shard without one. For a
        DataLoader (worker processes, pinned memory), use sampler()."""
        n, fetch = _fetcher(dataset)
        if self.train_samples and n != self.train_samples:
            raise ValueError(f"the dataset has {n} samples; this worker declared "
                             f"train_samples={self.train_samples}")
        b = self.batch_size if batch_size is None else int(batch_size)
        if b <= 0:
            raise ValueError(f"batch_size must be > 0, got {b}")
        if self.ledger and b != self.batch_size:
            raise ValueError(
                f"batch_size {b}: in a run with the sample ledger each step trains a batch of "
                f"the run's --batch_size ({self.batch_size}) samples of its round")
        return self._batches(n, b, fetch)

    def _batches(self, n: int, b: int,
                 fetch: Callable[[torch.Tensor], Any]) -> Iterator[Any]:
        while self.running:
            order = torch.tensor(list(self._sample_iter(n)), dtype=torch.int64)
            for a in range(0, len(order), b):
                if not self.running:
                    return
                yield fetch(order[a:a + b])

    def _sample_iter(self, n: int) -> Iterator[int]:
        """One pass of the samples to train (Sampler.__iter__): the open
        round's samples in a ledger run, else an epoch of the shard."""
        if not self.running:
            return iter(())
        if not self.ledger:
            shard = torch.arange(self.rank % self.shards, n, self.shards)
            g = torch.Generator()
            g.manual_seed((self._seed * 1000003 + self.rank) * 1000003 + self._passes)
            self._passes += 1
            return iter(shard[torch.randperm(len(shard), generator=g)].tolist())
        if self._handed == self._turn_number:
            raise Error(9, "FAILED_PRECONDITION",
                        f"the samples of round {self._round} were asked for twice before its "
                        f"{self._turn} steps were done: with the sample ledger each step trains "
                        f"a batch of the run's --batch_size ({self.batch_size}) of them, one "
                        "step() a batch (a DataLoader's batch_size must be w.batch_size)")
        self._handed = self._turn_number
        self._drawn = 0
        return self._draw(self._samples)

    def _draw(self, samples: List[int]) -> Iterator[int]:
        for i in samples:
            self._drawn += 1
            yield i

    def _check_samples_trained(self) -> None:
        # The turn's steps are done: the ledger records its samples as
        # trained once the round is agreed, so they must be what trained.
        if self._handed != self._turn_number:
            raise Error(9, "FAILED_PRECONDITION",
                        f"round {self._round}'s steps ended without its samples: the run keeps "
                        "a sample ledger, and the loop must train the samples the coordinator "
                        "named (w.sampler() or w.batches(), docs/PYTHON.md)")
        if self._drawn < len(self._samples):
            raise Error(9, "FAILED_PRECONDITION",
                        f"round {self._round}'s {self._turn} steps ended with "
                        f"{len(self._samples) - self._drawn} of its {len(self._samples)} "
                        "samples not taken: with the sample ledger each step trains a batch of "
                        f"the run's --batch_size ({self.batch_size}) (a DataLoader's batch_size "
                        "must be w.batch_size)")

    @property
    def running(self) -> bool:
        """True until the run is over for this worker (step() returned False)
        or it is closed."""
        return not self._closed and self._turn > 0

    @property
    def round(self) -> int:
        """The synchronous round the loop's steps train now: their progress
        is that round's contribution (0 in gossip mode). Without overlap the
        module started it from the agreed model of the round before; with
        overlap, round N+1 trains while round N is averaged."""
        return self._round

    @property
    def rounds(self) -> int:
        """Rounds whose steps the loop has trained so far (steps, in gossip
        mode)."""
        return self._rounds

    def agreed(self) -> Tuple[int, str]:
        """(round, SHA-256 hex) of the latest averaged model this worker
        holds: the hash the run's members vote on (identical on every member
        for a round in synchronous mode; pending until the round is
        settled). With overlap or fragments it is not the module's: the
        module is the local model (docs/PYTHON.md)."""
        return self._native.agreed()

    def model_hash(self) -> str:
        """SHA-256 (hex) of the model the members vote on. Without overlap or
        fragments, of Shoal's flat buffer as it is (the module, right after a
        step that ended a round; hashed in place, no copy); with them, of the
        agreed model (`agreed()`), which the module holds again once the run
        is over."""
        if self._local and not self._closed:
            return self.agreed()[1]
        return _hash_buffer(self._flat)

    def status(self) -> RunStatus:
        """The run's status from the coordinator."""
        try:
            return RunStatus.from_json(self._native.run_status())
        except _shoal.StatusError as e:
            raise _error(e) from None

    def result(self) -> Optional[Error]:
        """None while the worker runs or after it finished cleanly; the Error
        that ended it otherwise."""
        r = self._native.result()
        if r is None or r[0] == 0:
            return None
        return Error(*r)

    def close(self, reason: str = "closed by the training loop") -> None:
        """Leaves the run (the others go on without this worker) and stops.
        The run's status gives `reason` as this worker's (shoalctl status -o
        wide). The module keeps the last model the worker held. Calling it
        again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._turn = 0
        self._native.close(reason)
        # What the worker left in the buffer at its end (the agreed model,
        # with overlap or fragments) reaches the module's own tensors.
        turn = self._native.await_turn(0.0)
        if turn is not None and turn[0] == "closed" and turn[3]:
            self._sync.pull()
        _LogPump.flush()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> Literal[False]:
        """Closes the worker, with "interrupted (Ctrl-C)" or "the training
        loop raised <exception>" as the reason when the block did not end
        normally. The exception goes on."""
        if exc_type is KeyboardInterrupt:
            self.close("interrupted (Ctrl-C)")
        elif exc_type is not None:
            self.close(f"the training loop raised {exc_type.__name__}")
        else:
            self.close()
        return False

    def __del__(self) -> None:
        try:
            self.close("the Worker object was deleted")
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- turns

    def _await_turn(self) -> int:
        # Short waits: Ctrl-C reaches the loop between them.
        while True:
            turn = self._native.await_turn(0.2)
            if turn is None:
                continue
            kind, steps, round_, pull, push, local, ledger, samples, _ = turn
            if kind == "sync":  # the worker reads the buffer next
                self._sync.push()
                self._native.end_turn(0.0)
                continue
            if kind == "replay":  # an audit of another member's round
                try:
                    digest = self._replay(round_, samples, turn[8], steps)
                except Exception as e:  # noqa: BLE001 - reported, the audit is dropped
                    _log.warning("cannot replay round %d: %s: %s", round_, type(e).__name__, e)
                    self._native.end_replay("", f"{type(e).__name__}: {e}")
                else:
                    self._native.end_replay(digest, "")
                continue
            break
        self._local = local
        if pull:
            self._sync.pull()
        self.new_round = False
        if kind == "closed":
            return 0
        if local:
            # A turn is a step: a round ends where the next one's steps begin.
            if self._round and round_ != self._round:
                self._rounds += 1
                self.new_round = True
        elif self._round or self._rounds:
            self.new_round = True
        self._round = round_
        self._push = push
        self._taken = 0
        self._losses = []
        self._turn_number += 1
        self._ledger_turn = ledger
        self._samples = samples
        return steps

    def _end_turn(self) -> None:
        if self._push:
            self._sync.push()
        loss = sum(self._losses) / len(self._losses) if self._losses else 0.0
        if not math.isfinite(loss):
            loss = 0.0
        if not self._local:
            self._rounds += 1
        self._native.end_turn(loss)

    def _raise_result(self, otherwise: str) -> NoReturn:
        err = self.result()
        if err is not None:
            raise err
        raise Error(9, "FAILED_PRECONDITION", otherwise)


#: step(module, batch, optimizer) -> loss: one step of the loop (Worker(step=)).
StepFn = Callable[[torch.nn.Module, Any, torch.optim.Optimizer], Any]
#: optimizer(parameters) -> a torch optimizer (Worker(optimizer=)).
OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


def _round_seed(seed: int, round_: int) -> int:
    """Torch's generator seed for an audited round (the participant's and
    its auditor's), as the built-in trainer's RoundSeed, in 63 bits."""
    m = (1 << 64) - 1
    v = (seed * 0x9E3779B97F4A7C15 + round_ * 0xBF58476D1CE4E5B9 + 1) & m
    return v >> 1


def _feed_code(h: "hashlib._Hash", code: CodeType) -> None:
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_argcount)).encode())
    for c in code.co_consts:
        if isinstance(c, CodeType):
            _feed_code(h, c)
        else:
            h.update(repr(c).encode())


def _feed_callable(h: "hashlib._Hash", fn: Any) -> None:
    """What a replay runs of `fn`: its code (nested code too), the plain
    values it closes over or defaults to, or its type's name."""
    code = getattr(fn, "__code__", None)
    if code is None:
        h.update(f"{type(fn).__module__}.{type(fn).__qualname__}".encode())
        return
    _feed_code(h, code)
    plain = (int, float, str, bool, type(None))
    for v in list(fn.__defaults__ or ()) + [c.cell_contents for c in (fn.__closure__ or ())
                                            if _cell_set(c)]:
        h.update(repr(v).encode() if isinstance(v, plain) else type(v).__qualname__.encode())


def _cell_set(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def _replay_digest(module: torch.nn.Module, step: Any, optimizer: Any) -> str:
    """The part of the replay fingerprint a Python loop adds: the code of
    its step and optimizer factory, its module's class and torch's version.
    Members whose digests differ never audit each other."""
    h = hashlib.sha256()
    h.update(f"{type(module).__module__}.{type(module).__qualname__} torch "
             f"{torch.__version__}".encode())
    _feed_callable(h, step)
    _feed_callable(h, optimizer)
    return "python-step:" + h.hexdigest()[:16]


class Sampler(torch.utils.data.Sampler):
    """The samples a Worker trains, for a DataLoader (Worker.sampler()):
    each pass gives the open round's samples in a run with the sample
    ledger, or an epoch of the worker's shard without one. Made by
    Worker.sampler(); it indexes the training set of the worker's
    `train_samples`."""

    def __init__(self, worker: Worker) -> None:
        self.worker: Worker = worker

    def __iter__(self) -> Iterator[int]:
        return self.worker._sample_iter(self.worker.train_samples)

    def __len__(self) -> int:
        w = self.worker
        if w.ledger:
            return len(w._samples)
        return len(range(w.rank % w.shards, w.train_samples, w.shards))


def _fetcher(dataset: Any) -> Tuple[int, Callable[[torch.Tensor], Any]]:
    """(len, batch of indices -> batch) for Worker.batches()."""
    if isinstance(dataset, torch.utils.data.TensorDataset):
        dataset = tuple(dataset.tensors)
    if torch.is_tensor(dataset):
        t = dataset
        return len(t), lambda idx: t.index_select(0, idx)
    if isinstance(dataset, (tuple, list)) and dataset and all(torch.is_tensor(t) for t in dataset):
        tensors: Sequence[torch.Tensor] = tuple(dataset)
        lengths = {len(t) for t in tensors}
        if len(lengths) != 1:
            raise ValueError(f"the dataset's tensors differ in length: {sorted(lengths)}")
        return lengths.pop(), lambda idx: tuple(t.index_select(0, idx) for t in tensors)
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        collate = torch.utils.data.default_collate
        return len(dataset), lambda idx: collate([dataset[i] for i in idx.tolist()])
    raise TypeError("batches() takes a tensor, a tuple of tensors or a map-style Dataset, "
                    f"not {type(dataset).__name__}")


class Optimizer:
    """Wraps a torch optimizer so that each of its steps is also a Shoal step:
    `opt = shoal.Optimizer(torch.optim.AdamW(...), worker)`, then the loop
    calls `opt.step()` as before and stops when `worker.running` is False.
    Everything else (zero_grad, param_groups, state_dict, schedulers) is the
    wrapped optimizer's."""

    def __init__(self, optimizer: torch.optim.Optimizer, worker: Worker) -> None:
        self.optimizer: torch.optim.Optimizer = optimizer
        self.worker: Worker = worker

    def step(self, closure: Optional[Callable[[], Any]] = None,
             loss: Optional[Union[torch.Tensor, float]] = None) -> Any:
        """The optimizer's step, then `worker.step(loss)` (the closure's loss
        when there is one). Returns the closure's loss. Whether the run goes
        on is `worker.running`."""
        out = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        self.worker.step(loss if loss is not None else out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def _close_all() -> None:
    for w in list(_live):
        try:
            w.close("the Python process exits")
        except Exception:  # noqa: BLE001
            pass
    _LogPump.stop()


atexit.register(_close_all)


def _terminate(signum: int, frame: Optional[FrameType]) -> NoReturn:
    # SIGTERM (docker stop, kill): leave the run cleanly on the way out.
    sys.exit(128 + signum)


if threading.current_thread() is threading.main_thread():
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _terminate)
    except (ValueError, OSError):
        pass
