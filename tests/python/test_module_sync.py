"""The Python module's parts that need no run: the module moved into Shoal's
flat buffer one tensor at a time, the float32 master values of bf16 / fp16 /
CUDA tensors (pull, push as a delta), the layout they declare, and hashing the
buffer in place."""
import hashlib

import pytest
import torch

import conftest  # noqa: F401  (puts the built module on sys.path)
import shoal
from shoal import _shoal


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(field)


def _reset_peak():
    """Resets VmHWM (Linux clear_refs 5); skips where the kernel says no."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError as e:
        pytest.skip(f"cannot reset the peak RSS here: {e}")
    return _status("VmRSS")


class Wide(torch.nn.Module):
    """Three 4096 x 4096 layers: 64 MiB a weight, above glibc's largest mmap
    threshold, so that a freed weight leaves the process at once."""

    def __init__(self, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(4096, 4096, dtype=dtype, device=device) for _ in range(3))


def test_the_module_moves_into_the_buffer_one_tensor_at_a_time():
    model = Wide()
    bytes_ = sum(t.numel() * 4 for t in model.state_dict().values())
    before = {n: t.detach().clone() for n, t in model.state_dict().items()}
    base = _reset_peak()
    flat, entries = shoal.flatten_module(model)
    peak = _status("VmHWM")
    # The model once plus one tensor (64 MiB), never twice (192 MiB more).
    assert peak - base < 0.5 * bytes_, (peak - base, bytes_)
    assert all(e.kind == "view" for e in entries)
    for e in entries:
        t = model.state_dict()[e.name]
        assert t.data_ptr() == flat[e.offset:].data_ptr(), e.name  # a view, no copy
        assert torch.equal(t, before[e.name]), e.name


def test_the_buffer_is_hashed_in_place():
    flat = torch.randn(32 << 20)  # 128 MiB
    want = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    base = _reset_peak()
    got = shoal._hash_buffer(flat)
    assert _status("VmHWM") - base < 16 << 20, "no copy of the buffer"
    assert got == want


def test_a_bf16_module_declares_the_float32_layout_of_its_architecture():
    fp32 = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    half = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4)).to(torch.bfloat16)
    layouts = [shoal._layers(shoal.flatten_module(m)[1]) for m in (fp32, half)]
    assert layouts[0] == layouts[1]
    assert _shoal.layout_hash(layouts[0]) == _shoal.layout_hash(layouts[1])
    # The integer buffer keeps its own dtype, as with fp32 modules.
    assert [l[2] for l in layouts[1]] == ["float32"] * 6 + ["int64"]
    kinds = [e.kind for e in shoal.flatten_module(
        torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4)).to(torch.bfloat16))[1]]
    assert kinds == ["cast"] * 6 + ["int"]


def _sync_roundtrip(device):
    model = torch.nn.Linear(6, 6, bias=False, dtype=torch.bfloat16, device=device)
    flat, entries = shoal.flatten_module(model)
    sync = shoal._Sync(flat, entries)
    w = model.weight
    assert w.device.type == device and w.dtype == torch.bfloat16, "the module keeps its tensors"
    # A master the module's dtype cannot hold: 1 + 2^-12 is 1 in bf16.
    flat.fill_(1.0 + 2.0 ** -12)
    sync.pull()
    assert torch.equal(w, torch.ones_like(w))
    # No step: the master keeps every bit.
    sync.push()
    assert torch.equal(flat, torch.full_like(flat, 1.0 + 2.0 ** -12))
    # A step of +0.5 (exact in bf16): the master moves by exactly that and
    # keeps its sub-bf16 bits.
    with torch.no_grad():
        w += 0.5
    sync.push()
    assert torch.equal(flat, torch.full_like(flat, 1.5 + 2.0 ** -12))
    sync.pull()
    assert torch.equal(w, torch.full_like(w, 1.5))


def test_a_bf16_module_trains_against_float32_master_values():
    _sync_roundtrip("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here (docs/PYTHON.md)")
def test_a_cuda_module_syncs_with_the_master():
    _sync_roundtrip("cuda")


def test_a_large_tensor_syncs_in_bounded_chunks():
    # More elements than a chunk, fp16: each chunk is cast on its own and
    # the whole tensor comes back.
    n = shoal._CHUNK * 2 + 3
    model = torch.nn.Module()
    model.p = torch.nn.Parameter(torch.zeros(n, dtype=torch.float16))
    flat, entries = shoal.flatten_module(model)
    sync = shoal._Sync(flat, entries)
    flat.copy_(torch.arange(n, dtype=torch.float32) % 1000)
    sync.pull()
    assert torch.equal(model.p.float(), flat)
    with torch.no_grad():
        model.p += 1
    sync.push()
    assert torch.equal(flat, torch.arange(n, dtype=torch.float32) % 1000 + 1)


def test_float_tensors_are_views_and_others_are_refused_or_mirrored():
    model = torch.nn.Module()
    model.p = torch.nn.Parameter(torch.ones(3))
    model.register_buffer("count", torch.tensor(7))
    flat, entries = shoal.flatten_module(model)
    assert [e.kind for e in entries] == ["view", "int"]
    assert flat.tolist() == [1.0, 1.0, 1.0, 7.0]
    with pytest.raises(ValueError, match="meta device"):
        shoal.flatten_module(torch.nn.Linear(2, 2, device="meta"))
