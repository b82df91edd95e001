"""The CPU side of the prepared GPU check (scripts/gpu_check.sh, scripts/gpu_wheels.sh): without a GPU
it says so in one line and exits 2 before running anything; every path's command line is one our
parser accepts; the wheels it carries resolve for the GPU machine's Python 3.12 on manylinux x86_64."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_the_check_exits_at_once_without_a_gpu():
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_check.sh")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert out.stdout.splitlines() == ["gpu_check: no CUDA GPU here (nvidia-smi finds none): nothing was run"]


def test_the_python_side_exits_at_once_where_torch_sees_no_gpu(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2
    assert out.stdout.splitlines() == [
        "gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): nothing was run"]
    assert os.listdir(tmp_path) == []


from gpu_check import NEEDS, PATHS  # noqa: E402


@pytest.mark.parametrize("name", list(PATHS))
def test_each_path_is_a_command_line_swift_accepts(name, tmp_path):
    from swift.arguments.parser import parse_args
    from swift.cli.main import ARGUMENT_CLASSES, _import
    from swift.utils.registry import SwiftError

    command, *argv = PATHS[name][0]
    if name in NEEDS and name != "liger":  # liger's refusal on a CPU needs no liger-kernel
        pytest.importorskip(NEEDS[name])
    cls, argv = _import(ARGUMENT_CLASSES[command]), [*argv, "--output_dir", str(tmp_path)]
    if name == "liger":  # the flag is read, and refused on a CPU by design; the rest of its line parses
        with pytest.raises(SwiftError, match="^--use_liger_kernel: Liger's kernels are Triton GPU kernels"):
            parse_args(cls, argv)
        i = argv.index("--use_liger_kernel")
        argv = argv[:i] + argv[i + 2:]
    parse_args(cls, argv)


def test_the_carried_wheels_resolve_for_python_3_12_manylinux():
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_wheels.sh"), "--resolve"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    resolved = [line for line in out.stdout.splitlines() if line.startswith("resolved ")]
    # the pinned packages; their own dependencies follow PyPI (pydantic's grew by one on 2026-11-28), so
    # they are not counted
    names = {line.split()[1].split("==")[0].lower().replace("_", "-") for line in resolved}
    assert names >= {"transformers", "peft", "datasets", "math-verify", "trl", "liger-kernel", "bitsandbytes",
                     "nanogcg", "deepspeed"}, out.stdout
    assert "resolved deepspeed==0.19.8 (source archive)" in resolved, out.stdout
    assert any(line.startswith("resolved bitsandbytes==0.50.2 ") and "manylinux" in line for line in resolved)
