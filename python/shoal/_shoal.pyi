"""The C++ side of the shoal module (python/_shoal.cc): what it exposes, for
type checkers and editors. Internal: the public API is shoal.Worker
(python/shoal/__init__.py), which wraps _shoal.Worker. pybind11 names the
arguments arg0, arg1, ...; they are positional only.

tests/python/test_packaging.py checks that this stub names every function
and method the extension has, with as many arguments."""
from typing import Any, Dict, List, Optional, Sequence, Tuple, TypedDict

# (name, shape, dtype, offset, elements) of one state_dict entry, in the flat
# buffer's order: offsets contiguous from 0, the last one ending at its size.
_Layer = Tuple[str, Sequence[int], str, int, int]

# A turn for the training loop (ExternalTrainer::Turn): (kind, steps, round,
# pull, push, local, ledger, samples, batch). kind: "train" (the loop trains
# `steps` steps), "sync" (push the module's progress into the buffer, then
# end_turn), "replay" (an audit: train a copy of the module from the base
# copy_replay_base gives on `samples`, `batch` a step, `steps` steps, as
# round `round` was trained, then end_replay) or "closed" (the worker's run
# is over). pull: the module takes
# the buffer first; push: the turn ends with a push; local: turns are steps
# of a local model (overlap, fragments). ledger: a training turn of a run
# with the sample ledger, which trains exactly `samples` (indices into the
# training set of the size given as options["train_samples"]), `batch` a
# step.
_Turn = Tuple[str, int, int, bool, bool, bool, bool, List[int], int]

class _Info(TypedDict):
    config: str  # the run's RunConfig as JSON (proto field names); "" before the join
    data_rank: int
    address: str

class StatusError(Exception):
    """A failure of the C++ side: args are (grpc_code, code_name, message);
    shoal raises shoal.Error from it."""
    args: Tuple[int, str, str]

class Worker:
    """The worker host (services/worker/worker.h) on a thread of its own,
    training through an ExternalTrainer on the flat float32 buffer at
    `parameters` (`elements` floats, which must outlive the worker)."""

    def __init__(self, options: Dict[str, Any], parameters: int, elements: int,
                 layers: Sequence[_Layer], shard_size: int, /) -> None:
        """options: coordinator, listen, advertise, name, zone (str),
        outbound_only (bool), metrics_listen (str), connect_timeout,
        rpc_timeout, uplink_mbps (float), token_file, tls_cert, tls_key,
        tls_ca, tls_server_name (str), train_samples (int: the training
        set's size, declared at join for the sample ledger), replay_step
        (str: the digest of the step and optimizer the loop handed Shoal,
        appended to the replay fingerprint; "": it cannot be replayed). Raises StatusError (INVALID_ARGUMENT
        for an uplink that is no rate or layers that do not tile the buffer;
        TLS and token files that cannot be read)."""
    def start(self) -> str:
        """Binds the Peer service and starts joining; the address it serves.
        Releases the GIL."""
    def await_turn(self, timeout: float, /) -> Optional[_Turn]:
        """The next turn, or None after `timeout` seconds. Releases the GIL."""
    def end_turn(self, loss: float, /) -> None:
        """Hands the buffer back with the turn's mean loss."""
    def copy_replay_base(self, dst: int, elements: int, /) -> None:
        """Copies the open replay turn's base model into the float32 buffer
        at address `dst` (`elements` floats). Raises StatusError
        (FAILED_PRECONDITION: no replay turn open, another size)."""
    def end_replay(self, hash: str, error: str, /) -> None:
        """Ends the open replay turn with the replayed model's SHA-256 hex,
        or with `error` when the loop could not replay."""
    def report(self, accuracy: float, loss: float, /) -> None:
        """Test-set figures for the run's status."""
    def close(self, reason: str, /) -> None:
        """Leaves the run (if it still runs) and stops the host; idempotent."""
    def result(self) -> Optional[Tuple[int, str, str]]:
        """None while the host runs; its exit status (code, name, message)
        once it stopped (code 0: it finished)."""
    def info(self) -> _Info: ...
    def run_status(self) -> str:
        """The coordinator's GetRunStatus as JSON (the leader's among
        replicas). Raises StatusError."""
    def worker_id(self) -> str: ...
    def turns(self) -> int: ...
    def round(self) -> int: ...
    def agreed(self) -> Tuple[int, str]:
        """(round, SHA-256 hex) of the averaged model the worker holds."""

def layout_hash(layers: Sequence[_Layer], /) -> str:
    """The layout's hash, as the coordinator computes it (common/model_layout.h)."""
def install_log_queue() -> None:
    """Sends the C++ side's log lines to a queue that next_log_lines drains."""
def remove_log_queue() -> None: ...
def next_log_lines(timeout: float, /) -> List[Tuple[int, str]]:
    """The queued (level, message) lines, waiting up to `timeout` seconds
    for one; level 0 info, 1 warning, 2 error, 3 fatal. Releases the GIL."""
