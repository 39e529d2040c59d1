"""The ctypes mirror of the argument structs (m3qkv/_capi.py) against the C
header: the field names in order (parsed from include/m3qkv/m3qkv.h) and the
offset and size of every field and of each struct (a C program generated from
the mirror, compiled with the system C compiler against the header)."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

from m3qkv import _capi

HEADER = "include/m3qkv/m3qkv.h"
C_NAMES = {"fused": "m3qkv_fused_args", "insert": "m3qkv_insert_args", "gemm": "m3qkv_gemm_args",
           "quantize": "m3qkv_quantize_args", "prepare": "m3qkv_prepare_args", "selftest_entry": "m3qkv_selftest_entry",
           "selftest_report": "m3qkv_selftest_report"}


def header_fields(text, struct):
    """Field names of `typedef struct <struct> { ... }` in declaration order."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    m = re.search(r"typedef\s+struct\s+" + struct + r"\s*\{(.*?)\}\s*" + struct + r"\s*;", text, flags=re.S)
    assert m, f"{struct} not found in {HEADER}"
    names = []
    for decl in m.group(1).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        decl = re.sub(r"\s*\[\s*\w+\s*\]$", "", decl)  # an array: its name
        dm = re.fullmatch(r"[A-Za-z_][\w\s\*]*?[\s\*]([A-Za-z_]\w*)", decl)
        assert dm, f"{struct}: cannot parse the declaration {decl!r}"
        names.append(dm.group(1))
    return names


def cuda_include():
    for d in [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]:
        if d and os.path.exists(os.path.join(d, "include", "cuda_runtime_api.h")):
            return os.path.join(d, "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        d = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include")
        if os.path.exists(os.path.join(d, "cuda_runtime_api.h")):
            return d
    return None


@pytest.fixture(scope="module")
def header_text(repo_root):
    p = repo_root / HEADER
    if not p.exists():
        pytest.skip(f"{p} not found (set M3QKV_REPO_ROOT to the repository)")
    return p.read_text()


def mirror_for(kind, names):
    """The newest mirror whose field names equal the header's, or the full one."""
    full, layouts = _capi.STRUCTS[kind]
    for cls in layouts:
        if [f for f, _ in cls._fields_] == names:
            return cls
    return full


@pytest.mark.parametrize("kind", sorted(C_NAMES))
def test_field_names_match_header(kind, header_text):
    names = header_fields(header_text, C_NAMES[kind])
    cls = mirror_for(kind, names)
    assert [f for f, _ in cls._fields_] == names, (
        f"{C_NAMES[kind]}: the header's fields differ from every ctypes mirror in m3qkv/_capi.py:\n"
        f"  header: {names}\n  mirror: {[f for f, _ in cls._fields_]}")


def test_offsets_and_sizes_match_c(header_text, repo_root, tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    inc = cuda_include()
    if not cc or not inc:
        pytest.skip(f"needs a C compiler (found {cc}) and the CUDA include directory (found {inc})")
    mirrors = {}
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <m3qkv/m3qkv.h>", "int main(void) {"]
    for kind, cname in C_NAMES.items():
        cls = mirror_for(kind, header_fields(header_text, cname))
        mirrors[kind] = cls
        lines.append(f'  printf("{kind} . %zu %zu\\n", sizeof({cname}), (size_t)_Alignof({cname}));')
        for f, _ in cls._fields_:
            lines.append(f'  printf("{kind} {f} %zu %zu\\n", offsetof({cname}, {f}), '
                         f'sizeof((({cname}*)0)->{f}));')
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", f"-I{repo_root / 'include'}", f"-I{inc}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    c = {}
    for line in out.splitlines():
        kind, field, a, b = line.split()
        c[(kind, field)] = (int(a), int(b))
    bad = []
    for kind, cls in mirrors.items():
        want = c[(kind, ".")]
        got = (ctypes.sizeof(cls), ctypes.alignment(cls))
        if want != got:
            bad.append(f"{kind}: sizeof/alignof C {want} vs ctypes {got}")
        for f, _ in cls._fields_:
            desc = getattr(cls, f)
            if c[(kind, f)] != (desc.offset, desc.size):
                bad.append(f"{kind}.{f}: offset/size C {c[(kind, f)]} vs ctypes {(desc.offset, desc.size)}")
    assert not bad, "\n".join(bad)
    # The released older layouts (0.1; 0.2 without x_bf16) are prefixes of the
    # full ones, each ending where the next release's first field starts.
    for v0, full in [(_capi.FusedArgsV0, _capi.FusedArgs), (_capi.FusedArgsV0_2, _capi.FusedArgs),
                     (_capi.FusedArgsV0, _capi.FusedArgsV0_2), (_capi.InsertArgsV0, _capi.InsertArgs),
                     (_capi.GemmArgsV0, _capi.GemmArgs)]:
        assert full._fields_[:len(v0._fields_)] == v0._fields_
        assert getattr(full, full._fields_[len(v0._fields_)][0]).offset == ctypes.sizeof(v0)
    # The sizes the library pins for each release (src/api/validate.cpp).
    assert [ctypes.sizeof(c) for c in _capi.STRUCTS["fused"][1]] == [312, 296, 264]
    assert [ctypes.sizeof(c) for c in _capi.STRUCTS["gemm"][1]] == [88, 80]
    assert [ctypes.sizeof(c) for c in _capi.STRUCTS["insert"][1]] == [264, 232]


def test_library_accepts_its_struct_size():
    lib = _capi.library()
    assert lib.fused_struct_size in [ctypes.sizeof(c) for c in _capi.STRUCTS["fused"][1]]
    assert lib.insert_struct_size in (ctypes.sizeof(_capi.InsertArgs), ctypes.sizeof(_capi.InsertArgsV0))
    assert lib.gemm_struct_size in (ctypes.sizeof(_capi.GemmArgs), ctypes.sizeof(_capi.GemmArgsV0))
    # A size no release has is refused with STRUCT_SIZE and a message naming it.
    a = _capi.FusedArgs()
    a.struct_size = 8
    st = lib.fused_qkv(ctypes.addressof(a), None)
    assert st == _capi.ERROR_STRUCT_SIZE
    assert "struct_size = 8" in lib.last_error().decode()
