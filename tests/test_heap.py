"""The command lines' heap setting (tr_core.heap): applied to console-script runs and their workers only,
never to a program that calls a command with its own arguments, and never over the user's own settings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tr_core.heap import keep_heap

VARS = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES",
        "TR_MODEL_KEEP_HEAP")
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator settings")

# a command whose body reports what a worker it spawned would inherit
PROBE = ("import os, sys; from tr_core.cli import run_cli\n"
         "def body(argv):\n"
         "    print(os.environ.get('MALLOC_MMAP_MAX_'), os.environ.get('MALLOC_TRIM_THRESHOLD_'))\n"
         "sys.exit(run_cli(body, None if sys.argv[1] == 'script' else [], keep_heap=sys.argv[2] == 'keep'))\n")


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    env.update(extra)
    return env


def _probe(mode: str, keep: str, **extra) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, keep], capture_output=True, text=True,
                         env=_clean_env(**extra), timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@linux
def test_a_console_script_keeps_its_heap_and_hands_the_setting_to_its_workers():
    assert _probe("script", "keep") == ["0", str(2**31 - 1)]


@linux
def test_a_program_calling_a_command_with_arguments_keeps_its_own_allocator():
    assert _probe("call", "keep") == ["None", "None"]


@linux
def test_a_command_that_does_not_ask_for_it_changes_nothing():
    assert _probe("script", "no") == ["None", "None"]


@linux
def test_the_users_own_allocator_settings_and_the_opt_out_win():
    assert _probe("script", "keep", MALLOC_TRIM_THRESHOLD_="4096") == ["None", "4096"]
    assert _probe("script", "keep", TR_MODEL_KEEP_HEAP="0") == ["None", "None"]


def test_keep_heap_writes_only_the_environment_it_is_given():
    env = {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}
    assert keep_heap(env) is False
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}
