"""Servers the tests start never outlive the test run, even one killed with kill -9."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from tests.support.vllm_server import ROOT


def test_a_server_started_by_a_killed_test_run_dies_with_it():
    run = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.support.vllm_server import popen_owned
        server = popen_owned([sys.executable, "-c", "import time; time.sleep(600)"])
        print(server.pid, flush=True)
        time.sleep(600)
    """)
    test_run = subprocess.Popen([sys.executable, "-c", run], stdout=subprocess.PIPE, text=True)
    server = int(test_run.stdout.readline())
    os.kill(server, 0)  # running
    test_run.send_signal(signal.SIGKILL)
    test_run.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(server, signal.SIGKILL)
    raise AssertionError("the server outlived the test run that started it")

