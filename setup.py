"""Build torch_mm_variants._C: the C++ op, the CPU ladder and, when possible, the CUDA ladder.

CUDA sources are compiled when the installed torch was built with CUDA and nvcc is found;
otherwise the extension is CPU-only and every CUDA registration (which lives only in .cu files)
is simply absent. The CUDA arch list defaults to sm_80 (machine code, and PTX that the driver
compiles for newer GPUs, e.g. sm_100 and sm_120) plus sm_90a, and is overridden by
TORCH_CUDA_ARCH_LIST.
"""
import ctypes.util
import glob
import os
import re
import shlex
import subprocess

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

PACKAGE = "torch_mm_variants"
CSRC = os.path.join(PACKAGE, "csrc")
DEFAULT_CUDA_ARCHS = "8.0+PTX;9.0a"


def read_version() -> str:
    """torch_mm_variants/version.py, read as text: the package cannot be imported before it is built."""
    scope = {}
    with open(os.path.join(PACKAGE, "version.py")) as f:
        exec(f.read(), scope)
    return scope["__version__"]


def want_cuda() -> bool:
    if os.environ.get("MM_VARIANTS_FORCE_CPU", "0") == "1":
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None


def builds_sm90a() -> bool:
    """Whether the arch list compiles the sm_90a target (wgmma, setmaxnreg): "9.0a" in
    TORCH_CUDA_ARCH_LIST, which torch turns into -gencode=arch=compute_90a,code=sm_90a."""
    archs = os.environ["TORCH_CUDA_ARCH_LIST"].replace(";", " ").split()
    return any(arch.removesuffix("+PTX") == "9.0a" for arch in archs)


def nvcc_release() -> tuple[int, int]:
    """The release of the nvcc that compiles the .cu files (PYTORCH_NVCC where set, as torch's
    build takes it, else CUDA_HOME's), e.g. (13, 0); (0, 0) if unknown."""
    nvcc = os.environ.get("PYTORCH_NVCC") or (CUDA_HOME and os.path.join(CUDA_HOME, "bin", "nvcc"))
    if not nvcc:
        return (0, 0)
    try:
        version = subprocess.run(shlex.split(nvcc) + ["--version"],
                                 capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return (0, 0)
    found = re.search(r"release (\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def parallel_device_compile() -> list[str]:
    """nvcc's optimizer on every core for each file. 08_tensor_core.cu instantiates its kernel
    some 150 times and finishes long after the other files; on two threads (a two-core machine)
    nvcc compiled it in 122 s instead of 180, with the same SASS for every kernel (cuobjdump,
    sm_90a). On 16 cores (MAX_JOBS=16, sm_90a) it took 158 s instead of 401-480, in a fresh
    build of the package of 175 s; six more fresh builds there took 117-154 s."""
    return ["--split-compile=0"] if nvcc_release() >= (12, 0) else []


def sources(pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(CSRC, pattern), recursive=True))


def link_flags() -> list[str]:
    """OpenMP for at::parallel_for, and the shared C++ runtime linked by name and first. A
    compiler that links libstdc++ statically by default would give the extension a second copy
    beside torch's, and that copy's streams (used by every TORCH_CHECK message) crash."""
    flags = ["-fopenmp"]
    shared_cxx_runtime = ctypes.util.find_library("stdc++")  # e.g. libstdc++.so.6
    if shared_cxx_runtime:
        flags += ["-Wl,--push-state,--no-as-needed", f"-l:{shared_cxx_runtime}", "-Wl,--pop-state"]
    return flags


def extension():
    cxx_flags = ["-O3", "-ffp-contract=fast", "-fopenmp"]
    cpp_sources = sources("**/*.cpp")
    if not want_cuda():
        return CppExtension(
            f"{PACKAGE}._C", cpp_sources,
            extra_compile_args={"cxx": cxx_flags}, extra_link_args=link_flags())
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS)
    nvcc_flags = ["-O3", "--expt-relaxed-constexpr", "-lineinfo",
                  "-Xptxas=-warn-spills"] + parallel_device_compile()
    if builds_sm90a():  # the wgmma rung is registered only when its kernels are compiled
        nvcc_flags.append("-DMM_VARIANTS_WITH_SM90A")
    return CUDAExtension(
        f"{PACKAGE}._C", cpp_sources + sources("**/*.cu"),
        extra_compile_args={"cxx": cxx_flags + ["-DMM_VARIANTS_WITH_CUDA"],
                            "nvcc": nvcc_flags + ["-DMM_VARIANTS_WITH_CUDA"]},
        extra_link_args=link_flags())


def torch_requirement() -> str:
    """The torch the extension is compiled against, to its minor version: its C++ ABI changes
    between minor versions, so a wheel must not be installed beside another one."""
    major, minor = torch.__version__.split(".")[:2]
    return f"torch=={major}.{minor}.*"


setup(
    name=PACKAGE,
    version=read_version(),
    description="One matmul op, many kernels: a CPU and CUDA ladder from naive to tensor cores",
    packages=[PACKAGE],
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.10",
    install_requires=[torch_requirement()],
)
