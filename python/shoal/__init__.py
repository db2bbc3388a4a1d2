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
place (the module's tensors are views of Shoal's buffer) and gives it back for
the next round. See docs/PYTHON.md.
"""

import atexit
import dataclasses
import hashlib
import json
import logging
import math
import signal
import sys
import threading
import weakref
from typing import Any, Dict, List, Optional

import torch

from . import _shoal

__all__ = ["Error", "Worker", "Optimizer", "RunStatus", "MemberStatus", "flatten_module"]

_log = logging.getLogger("shoal")


class Error(RuntimeError):
    """A Shoal failure, with its gRPC status: `code` is the status name
    ("FAILED_PRECONDITION", "UNAUTHENTICATED", ...), `grpc_code` its number."""

    def __init__(self, grpc_code: int, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.grpc_code = grpc_code
        self.code = code
        self.message = message


def _error(e: "_shoal.StatusError") -> Error:
    return Error(*e.args)


# ------------------------------------------------------------------ the module


@dataclasses.dataclass
class _Entry:
    name: str
    tensor: torch.Tensor
    offset: int
    numel: int
    mirrored: bool  # not float32: copied to and from the flat buffer


def flatten_module(module: torch.nn.Module):
    """Moves the module's state_dict tensors into one flat float32 tensor.

    Parameters and float32 buffers become views of it (the optimizer keeps
    the same Parameter objects); other buffers (BatchNorm's
    num_batches_tracked) are mirrored as float32 elements. The order is the
    C++ worker's: trainable parameters, frozen parameters, float32 buffers,
    the rest. Returns (flat, entries)."""
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
        if name in params:
            if t.dtype != torch.float32:
                raise ValueError(
                    f"parameter '{name}' is {str(t.dtype)[6:]}; Shoal trains float32 "
                    "parameters (call module.float())")
            if t.device.type != "cpu":
                raise ValueError(f"parameter '{name}' is on {t.device}; Shoal trains on the CPU")
            (trainable if t.requires_grad else frozen).append((name, t))
        elif t.dtype == torch.float32:
            float_buffers.append((name, t))
        else:
            others.append((name, t))
    ordered = trainable + frozen + float_buffers + others
    if not ordered:
        raise ValueError("the module has no parameters or buffers to train")
    total = sum(t.numel() for _, t in ordered)
    flat = torch.zeros(total, dtype=torch.float32)
    entries: List[_Entry] = []
    offset = 0
    with torch.no_grad():
        for name, t in ordered:
            n = t.numel()
            view = flat[offset:offset + n]
            view.copy_(t.detach().reshape(-1).to(torch.float32))
            mirrored = t.dtype != torch.float32
            if not mirrored:
                t.data = view.view(t.shape)
            entries.append(_Entry(name, t, offset, n, mirrored))
            offset += n
    return flat, entries


def _layers(entries: List[_Entry]):
    return [(e.name, list(e.tensor.shape), str(e.tensor.dtype).replace("torch.", ""),
             e.offset, e.numel) for e in entries]


# ------------------------------------------------------------------ status


@dataclasses.dataclass
class MemberStatus:
    """One worker of the run, as the coordinator sees it."""
    id: str
    name: str
    address: str
    state: str
    model_round: int
    train_loss: float
    test_accuracy: float
    reason: str


@dataclasses.dataclass
class RunStatus:
    """The run, from the coordinator (GetRunStatus). `raw` holds every field."""
    run_id: str
    phase: str
    round: int
    last_completed_round: int
    model_hash: str
    members: int
    workers: List[MemberStatus]
    raw: Dict[str, Any]

    @staticmethod
    def from_json(text: str) -> "RunStatus":
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
                         workers=workers, raw=d)


# ------------------------------------------------------------------ logging


class _LogPump:
    """Hands the C++ side's log lines to Python's `logging` ("shoal" logger),
    from a thread of its own: no C++ thread ever calls into Python."""

    _lock = threading.Lock()
    _thread: Optional[threading.Thread] = None
    _stop = threading.Event()
    _levels = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.CRITICAL}

    @classmethod
    def start(cls):
        with cls._lock:
            if cls._thread is not None:
                return
            _shoal.install_log_queue()
            cls._stop.clear()
            cls._thread = threading.Thread(target=cls._run, name="shoal-log", daemon=True)
            cls._thread.start()

    @classmethod
    def _emit(cls, lines):
        for level, message in lines:
            _log.log(cls._levels.get(level, logging.INFO), "%s", message)

    @classmethod
    def _run(cls):
        while not cls._stop.is_set():
            cls._emit(_shoal.next_log_lines(0.2))

    @classmethod
    def flush(cls):
        cls._emit(_shoal.next_log_lines(0.0))

    @classmethod
    def stop(cls):
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
    paced to fit it; 0 = unpaced; docs/OVERLAP.md), and `shard_size` (the
    samples of this worker's shard, for the checkpoints' epoch count;
    0 = unknown).
    """

    def __init__(self, module: torch.nn.Module, coordinator: str = "127.0.0.1:50051", *,
                 name: str = "", listen: str = "127.0.0.1:0", advertise: str = "",
                 zone: str = "", token_file: str = "", tls_cert: str = "", tls_key: str = "",
                 tls_ca: str = "", tls_server_name: str = "", outbound_only: bool = False,
                 metrics_listen: str = "", connect_timeout: float = 60.0,
                 rpc_timeout: float = 10.0, uplink_mbps: float = 0.0, shard_size: int = 0):
        self._closed = True
        self.module = module
        self._flat, self._entries = flatten_module(module)
        self._mirrored = [e for e in self._entries if e.mirrored]
        options = dict(coordinator=coordinator, listen=listen, advertise=advertise, name=name,
                       zone=zone, outbound_only=outbound_only, metrics_listen=metrics_listen,
                       connect_timeout=float(connect_timeout), rpc_timeout=float(rpc_timeout),
                       uplink_mbps=float(uplink_mbps),
                       token_file=token_file, tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca,
                       tls_server_name=tls_server_name)
        _LogPump.start()
        try:
            self._native = _shoal.Worker(options, self._flat.data_ptr(), self._flat.numel(),
                                         _layers(self._entries), int(shard_size))
            self.address = self._native.start()
        except _shoal.StatusError as e:
            raise _error(e) from None
        self._closed = False
        _live.add(self)
        self._losses: List[float] = []
        self._turn = 0  # steps of the open turn (0: the run is over)
        self._taken = 0
        self._rounds = 0
        #: True right after a step() that ended a turn: the module now holds
        #: the averaged model of the next round (evaluate it now).
        self.new_round = False
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
        self.gossip: bool = "gossip" in self.config
        _log.info("joined as %s at %s: %d tensors, %d elements, %s", self.worker_id, self.address,
                  len(self._entries), self._flat.numel(),
                  "gossip" if self.gossip else f"{self.local_steps} local steps a round")

    # -- the loop's side

    def step(self, loss=None) -> bool:
        """Call once after each optimizer step. When the turn's steps are
        done (a round's local steps; one step in gossip mode) the module goes
        to Shoal and comes back averaged. False once the run is over for this
        worker (it finished, or was removed: see `result`)."""
        self.new_round = False
        if self._closed or self._turn == 0:
            return False
        if loss is not None:
            self._losses.append(float(loss.detach()) if torch.is_tensor(loss) else float(loss))
        self._taken += 1
        if self._taken < self._turn:
            return True
        self._end_turn()
        self._turn = self._await_turn()
        self.new_round = self._turn > 0
        return self._turn > 0

    def report(self, accuracy: float, loss: float = 0.0):
        """Test-set figures of the current model, shown in the run's status
        with the next round."""
        self._native.report(float(accuracy), float(loss))

    @property
    def running(self) -> bool:
        return not self._closed and self._turn > 0

    @property
    def round(self) -> int:
        """The synchronous round this worker trains now: the module holds the
        agreed model of the round before it (0 in gossip mode)."""
        return self._native.round()

    @property
    def rounds(self) -> int:
        """Turns handed to Shoal so far (rounds, in synchronous mode)."""
        return self._rounds

    def model_hash(self) -> str:
        """SHA-256 (hex) of the model as Shoal holds it: the hash the run's
        members vote on (identical on every member after each round in
        synchronous mode). Valid between steps."""
        return hashlib.sha256(self._flat.numpy().tobytes()).hexdigest()

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

    def close(self, reason: str = "closed by the training loop"):
        """Leaves the run (the others go on without this worker) and stops."""
        if self._closed:
            return
        self._closed = True
        self._turn = 0
        self._native.close(reason)
        _LogPump.flush()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is KeyboardInterrupt:
            self.close("interrupted (Ctrl-C)")
        elif exc_type is not None:
            self.close(f"the training loop raised {exc_type.__name__}")
        else:
            self.close()
        return False

    def __del__(self):
        try:
            self.close("the Worker object was deleted")
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- turns

    def _await_turn(self) -> int:
        # Short waits: Ctrl-C reaches the loop between them.
        while True:
            steps = self._native.await_turn(0.2)
            if steps is not None:
                break
        if steps > 0:
            with torch.no_grad():
                for e in self._mirrored:
                    e.tensor.copy_(self._flat[e.offset:e.offset + e.numel].round()
                                   .view(e.tensor.shape).to(e.tensor.dtype))
        self._taken = 0
        self._losses = []
        return steps

    def _end_turn(self):
        with torch.no_grad():
            for e in self._mirrored:
                self._flat[e.offset:e.offset + e.numel].copy_(
                    e.tensor.detach().reshape(-1).to(torch.float32))
        loss = sum(self._losses) / len(self._losses) if self._losses else 0.0
        if not math.isfinite(loss):
            loss = 0.0
        self._rounds += 1
        self._native.end_turn(loss)

    def _raise_result(self, otherwise: str):
        err = self.result()
        if err is not None:
            raise err
        raise Error(9, "FAILED_PRECONDITION", otherwise)


class Optimizer:
    """Wraps a torch optimizer so that each of its steps is also a Shoal step:
    `opt = shoal.Optimizer(torch.optim.AdamW(...), worker)`, then the loop
    calls `opt.step()` as before and stops when `worker.running` is False.
    Everything else (zero_grad, param_groups, state_dict, schedulers) is the
    wrapped optimizer's."""

    def __init__(self, optimizer: torch.optim.Optimizer, worker: Worker):
        self.optimizer = optimizer
        self.worker = worker

    def step(self, closure=None, loss=None):
        """The optimizer's step, then `worker.step(loss)` (the closure's loss
        when there is one). Returns the closure's loss."""
        out = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        self.worker.step(loss if loss is not None else out)
        return out

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


def _close_all():
    for w in list(_live):
        try:
            w.close("the Python process exits")
        except Exception:  # noqa: BLE001
            pass
    _LogPump.stop()


atexit.register(_close_all)


def _terminate(signum, frame):
    # SIGTERM (docker stop, kill): leave the run cleanly on the way out.
    sys.exit(128 + signum)


if threading.current_thread() is threading.main_thread():
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _terminate)
    except (ValueError, OSError):
        pass
