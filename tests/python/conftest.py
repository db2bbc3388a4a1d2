"""The Python module's tests: real shoal-coordinator, shoal-worker and
shoal-checkpoint processes and Python workers (examples/python and
tests/python/worker_main.py) on 127.0.0.1, stopped by PID, always."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("SHOAL_BIN_DIR", ROOT / "build" / "bin"))
PYTHONPATH = os.environ.get("SHOAL_PYTHONPATH", str(BIN.parent / "python"))
DATA = "/usr/share/datasets/fashion-mnist"
sys.path.insert(0, PYTHONPATH)  # `import shoal` in the tests themselves


def wait_until(condition, timeout, what):
    """Polls `condition` until it returns a true value (returned) or
    `timeout` seconds pass (AssertionError naming `what`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


class Proc:
    def __init__(self, argv, log_path, env=None):
        self.argv = argv
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "wb")
        self.p = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=env)

    @property
    def pid(self):
        return self.p.pid

    def log(self):
        return self.log_path.read_text(errors="replace")

    def running(self):
        return self.p.poll() is None

    def wait_for(self, pattern, timeout=120):
        """The first match of `pattern` in the log; fails if the process ends
        first or after `timeout` s."""
        rx = re.compile(pattern, re.M)

        def found():
            m = rx.search(self.log())
            if m:
                return m
            if not self.running():
                m = rx.search(self.log())
                if m:
                    return m
                raise AssertionError(f"{self.argv[0]} exited ({self.p.returncode}) before "
                                     f"/{pattern}/:\n{self.log()[-4000:]}")
            return None

        return wait_until(found, timeout, f"/{pattern}/ in {self.log_path.name}")

    def wait(self, timeout):
        return self.p.wait(timeout=timeout)

    def signal(self, sig):
        if self.running():
            os.kill(self.p.pid, sig)

    def stop(self, grace=10):
        if self.running():
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=30)
        self._log.close()
        return self.p.returncode


class Cluster:
    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.procs = []
        self.coordinator_address = None
        self.env = dict(os.environ, PYTHONPATH=PYTHONPATH, PYTHONUNBUFFERED="1")

    def _start(self, argv, name, env=None):
        p = Proc([str(a) for a in argv], self.dir / f"{name}.log", env=env or self.env)
        self.procs.append(p)
        return p

    def coordinator(self, *flags):
        c = self._start([BIN / "shoal-coordinator", "--listen=127.0.0.1:0", *flags],
                        "coordinator")
        self.coordinator_address = c.wait_for(r"listening on ([0-9.]+:[0-9]+)", 60).group(1)
        self.coordinator_proc = c
        return self.coordinator_address

    def store(self, *flags):
        s = self._start([BIN / "shoal-checkpoint", "--listen=127.0.0.1:0",
                         f"--data_dir={self.dir / 'store'}", *flags], "store")
        return s.wait_for(r"listening on ([0-9.]+:[0-9]+)", 60).group(1)

    def python(self, script, name, *args):
        return self._start([sys.executable, script, f"--coordinator={self.coordinator_address}",
                            f"--name={name}", *args], name)

    def example(self, example, name, *args):
        return self.python(ROOT / "examples" / "python" / example, name, *args)

    def worker_main(self, name, *args):
        return self.python(ROOT / "tests" / "python" / "worker_main.py", name, *args)

    def cpp_worker(self, name, *flags):
        return self._start([BIN / "shoal-worker", f"--coordinator={self.coordinator_address}",
                            "--listen=127.0.0.1:0", f"--data_dir={DATA}", "--eval_limit=2000",
                            f"--name={name}", *flags], name)

    def status(self):
        out = subprocess.run([str(BIN / "shoalctl"), "status",
                              f"--coordinator={self.coordinator_address}", "--json"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def logs(self):
        return "\n".join(f"--- {p.log_path.name} ---\n{p.log()[-3000:]}" for p in self.procs)

    def stop_all(self):
        for p in reversed(self.procs):
            p.stop()


@pytest.fixture
def cluster(tmp_path, request):
    c = Cluster(tmp_path)
    yield c
    c.stop_all()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(c.logs())


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def round_hashes(text):
    """{round: hash} from the 'round R ... hash H' lines of a Python worker."""
    return {int(m.group(1)): m.group(2)
            for m in re.finditer(r"^round (\d+) .*hash ([0-9a-f]{64})$", text, re.M)}
