"""Unit checks of the soak's tooling: the flags of scripts/install-deps.sh and soak.py --replot.

Both were found by the 2-hour soak at f5392ee: `install-deps.sh --fuzz --soak` read only its
first flag, so the soak ran without matplotlib and drew no plot; --replot draws it afterwards."""
import csv
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALL = os.path.join(ROOT, "scripts", "install-deps.sh")
SOAK = os.path.join(ROOT, "tests", "soak", "soak.py")


def listed(*flags):
    env = dict(os.environ, INSTALL_DEPS_LIST="1")
    out = subprocess.run(["bash", INSTALL, *flags], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_install_deps_flags_combine_in_any_order():
    base = listed()
    for flags in (("--fuzz", "--soak"), ("--soak", "--fuzz")):
        both = listed(*flags)
        assert {"clang", "libclang-rt-14-dev", "python3-matplotlib", "curl"} <= both, flags
        assert base <= both
    assert "python3-matplotlib" not in listed("--fuzz")
    assert "clang" not in listed("--soak")
    assert "prometheus" not in listed("--image")


def test_install_deps_refuses_an_unknown_flag():
    env = dict(os.environ, INSTALL_DEPS_LIST="1")
    out = subprocess.run(["bash", INSTALL, "--soak", "--sok"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert "unknown flag '--sok'" in out.stderr


def write(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def test_replot_draws_the_plot_from_a_report(tmp_path):
    write(tmp_path / "rounds.csv", ["round", "first_seen_s", "model_hash"],
          [[r, 2.0 * r, "ab" * 32] for r in range(1, 40)])
    write(tmp_path / "stalls.csv", ["start_s", "seconds", "bound_s", "faults"],
          [[2.0 * r, 2.0, 120, "1" if r == 10 else ""] for r in range(1, 39)])
    write(tmp_path / "faults.csv", ["id", "kind", "target", "start_s", "seconds", "detail"],
          [[1, "kill_worker", "a1.1", 20.0, 9.5, "restarted as a1.2"],
           [2, "stop_etcd", "e0", 40.0, 5.0, "SIGSTOP"]])
    write(tmp_path / "samples.csv",
          ["t_s", "process", "role", "rss_kb", "fds", "threads", "rss_anon_kb", "rss_file_kb"],
          [[15.0 * i, name, role, 40000 + i, 30, 10, 20000, 20000]
           for i in range(6) for name, role in (("e0", "etcd"), ("a1.1", "worker"))])
    out = subprocess.run([sys.executable, SOAK, "--replot", str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # Without Debian's matplotlib it must say so and fail, not write a broken file.
        assert out.returncode == 2
        assert "matplotlib not installed" in out.stderr
        assert not (tmp_path / "soak.png").exists()
        return
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "soak.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_replot_of_a_directory_without_a_report_fails_and_names_the_file(tmp_path):
    out = subprocess.run([sys.executable, SOAK, "--replot", str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert "rounds.csv" in out.stderr


def test_etcd_memory_tells_pages_touched_late_from_a_heap_that_grows(tmp_path):
    # Two members sampled every 60 s for 20 minutes. e0 holds a flat 32 MiB
    # heap whose pages are touched late (RSS climbs); e1's held heap grows.
    samples, go = [], []
    for i in range(21):
        t = 60.0 * i
        samples.append([t, "e0", "etcd", 22528 + 12288 + 512 * i, 30, 10, 12288 + 512 * i, 22528])
        samples.append([t, "e1", "etcd", 22528 + 24576 + 512 * i, 30, 10, 24576 + 512 * i, 22528])
        go.append([t, "e0", 100, 24 << 20, 12 << 20, 4 << 20, 31 << 20])
        go.append([t, "e1", 100, (24 << 20) + (i << 19), 12 << 20, 4 << 20, 31 << 20])
    write(tmp_path / "samples.csv",
          ["t_s", "process", "role", "rss_kb", "fds", "threads", "rss_anon_kb", "rss_file_kb"],
          samples)
    write(tmp_path / "etcd_go.csv",
          ["t_s", "process", "go_goroutines", "go_memstats_heap_inuse_bytes",
           "go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes",
           "go_memstats_next_gc_bytes"], go)
    out = subprocess.run([sys.executable, SOAK, "--etcd_memory", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[2:]}
    # Judged from minute 10: medians at minutes 11 and 19. e0: RSS 39.5 -> 43.5 MiB
    # (+10.1 %) while its held heap stays 32 MiB; e1: the held heap 37.5 -> 41.5 MiB.
    assert "39.5 ->  43.5  +10.1%" in rows["e0"], rows["e0"]
    assert rows["e0"].rstrip().endswith("32.0 ->  32.0   +0.0%"), rows["e0"]
    assert rows["e1"].rstrip().endswith("37.5 ->  41.5  +10.7%"), rows["e1"]


def test_etcd_memory_of_a_directory_without_a_report_fails(tmp_path):
    out = subprocess.run([sys.executable, SOAK, "--etcd_memory", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "samples.csv" in out.stderr


def test_a_soak_without_bin_is_a_usage_error():
    out = subprocess.run([sys.executable, SOAK, "--minutes=1"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "--bin is required" in out.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
