"""The collector's capability check names what it lacks, for the kernel it runs on."""

import os

import pytest

from otel_gil_collector import uprobe_check
from otel_gil_collector.__main__ import missing_capabilities

SYS_PTRACE, SYS_ADMIN, PERFMON, BPF = (1 << 19), (1 << 21), (1 << 38), (1 << 39)
DAC_OVERRIDE, DAC_READ_SEARCH = (1 << 1), (1 << 2)
LAST_CAP = 40  # a kernel with CAP_BPF (5.8+)
FILES = DAC_READ_SEARCH  # an app's /proc/PID/map_files/ (mode 0500, its uid's)


@pytest.mark.parametrize("caps, refused, missing", [
    (SYS_ADMIN | SYS_PTRACE | FILES, True, []),
    (SYS_PTRACE | FILES, True, ["CAP_SYS_ADMIN"]),  # uprobes refused: only CAP_SYS_ADMIN opens them (6.18 here)
    (BPF | PERFMON | SYS_PTRACE | FILES, True, ["CAP_SYS_ADMIN"]),
    (BPF | PERFMON | SYS_PTRACE | FILES, False, []),  # a kernel that opens uprobes with CAP_PERFMON
    (PERFMON | SYS_PTRACE | FILES, False, ["CAP_BPF"]),
    (SYS_ADMIN | FILES, True, ["CAP_SYS_PTRACE"]),
    (SYS_ADMIN | SYS_PTRACE, True, ["CAP_DAC_READ_SEARCH"]),  # the chart's before: apps of another uid refused
    (SYS_ADMIN | SYS_PTRACE | DAC_OVERRIDE, True, []),  # it covers DAC_READ_SEARCH
    (0, True, ["CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"]),
])
def test_missing_capabilities(caps, refused, missing):
    assert missing_capabilities(caps, LAST_CAP, refused) == missing


def test_before_cap_bpf_sys_admin_stands_for_it():
    assert missing_capabilities(PERFMON | SYS_PTRACE | FILES, 37, False) == ["CAP_SYS_ADMIN"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the refusal is checked without it in test_preflight")
def test_root_opens_a_uprobe():
    assert uprobe_check.refusal() is None
