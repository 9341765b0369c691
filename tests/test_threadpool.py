"""umahub gives TVM's thread pool a short spin (umahub.runtime.threadpool)."""

import os
import subprocess
import sys

import pytest

from umahub.runtime.threadpool import SPIN_COUNT

CODE = "import os, umahub; print(os.environ.get('TVM_THREAD_POOL_SPIN_COUNT'))"


def _spin_count_after_import(**env):
    clean = {k: v for k, v in os.environ.items() if k != "TVM_THREAD_POOL_SPIN_COUNT"}
    out = subprocess.run(
        [sys.executable, "-c", CODE], env={**clean, **env}, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return out.stdout.strip()


def test_import_umahub_sets_a_short_spin_before_tvm_starts_a_pool():
    assert SPIN_COUNT == 3000
    assert _spin_count_after_import() == "3000"


@pytest.mark.parametrize("value", ["0", "300000"])
def test_a_spin_count_the_user_set_is_left_alone(value):
    assert _spin_count_after_import(TVM_THREAD_POOL_SPIN_COUNT=value) == value
