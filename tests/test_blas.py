"""The harness picks MKL's fast code path itself on AMD CPUs (bench/blas.py), and never overrides a user's choice."""
from __future__ import annotations

import subprocess
import sys

from bench.artifacts import PROJECT_ROOT
from bench.blas import CHOSEN_BY_HARNESS, choose_code_path, code_path_origin, cpu_vendor


def test_amd_gets_the_avx2_path_and_knows_who_chose_it():
    environ = {}
    choose_code_path(environ, vendor="AuthenticAMD")
    assert environ == {"MKL_CBWR": "AVX2", CHOSEN_BY_HARNESS: "1"}
    assert code_path_origin(environ) == "harness"


def test_intel_and_a_users_choice_are_left_alone():
    intel = {}
    choose_code_path(intel, vendor="GenuineIntel")
    assert intel == {} and code_path_origin(intel) is None
    user = {"MKL_CBWR": "AUTO"}
    choose_code_path(user, vendor="AuthenticAMD")
    assert user == {"MKL_CBWR": "AUTO"} and code_path_origin(user) == "user"
    other = {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    choose_code_path(other, vendor="AuthenticAMD")
    assert other == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"} and code_path_origin(other) == "user"


def test_vendor_comes_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n")
    assert cpu_vendor(cpuinfo) == "AuthenticAMD"
    assert cpu_vendor(tmp_path / "missing") is None


def test_importing_bench_sets_the_path_before_torch_loads_mkl():
    """A fresh interpreter: `import bench` alone sets it on this host's vendor, before torch is imported."""
    probe = ("import os, sys; import bench; print(os.environ.get('MKL_CBWR'), 'torch' in sys.modules)")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    expected = "AVX2" if cpu_vendor() == "AuthenticAMD" else "None"
    assert out.stdout.split() == [expected, "False"]
