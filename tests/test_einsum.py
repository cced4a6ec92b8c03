"""Workloads from equations, einsum specs and the conv2d builder; their one-line errors."""
import pytest

from cachetile.api.request import PlanRequest
from cachetile.models.einsum import workload_from_equations
from cachetile.models.errors import InvalidInput
from cachetile.models.indexing import parse_index
from cachetile.models.workload import Workload, builtin, workload_from_dict


def test_presets_are_their_equations():
    chain = workload_from_equations(["gemm1: C[m,l] = A[m,k]*B[k,l]", "gemm2: E[m,n] = C[m,l]*D[l,n]"],
                                    {"m": 4, "l": 8, "k": 4, "n": 16}, kind="gemm-chain")
    assert chain == builtin("gemm-chain", {"m": 4, "l": 8, "k": 4, "n": 16})
    assert chain.tensors["C"].role == "intermediate" and chain.signature == ["A", "B", "D", "E"]


def test_einsum_spec_names_inputs_then_output():
    w = workload_from_equations("bmk,bkn->bmn", {"b": 12, "m": 512, "n": 512, "k": 64})
    assert {n: t.dims for n, t in w.tensors.items()} == {"A": ["b", "m", "k"], "B": ["b", "k", "n"], "C": ["b", "m", "n"]}
    assert list(w.dims) == ["b", "m", "n", "k"] and w.flops == 2 * 12 * 512 * 512 * 64


def test_affine_indices_inline():
    w = workload_from_equations(["O[n,k,oh,ow] = I[n,c,2*oh+kh-1,2*ow+kw-1]*W[k,c,kh,kw]"],
                                {"n": 1, "k": 4, "oh": 5, "ow": 5, "c": 3, "kh": 3, "kw": 3}, shapes={"I": [1, 3, 9, 9]})
    assert w.extents("I") == [1, 3, 11, 11] and w.shape("I") == [1, 3, 9, 9]
    assert parse_index("2*oh+kh-1").terms == (("oh", 2), ("kh", 1)) and parse_index("2*oh+kh-1").offset == -1


@pytest.mark.parametrize("equations,message", [
    (["C[m,n] = A[m,k]*B[k,n"], "equation 1 'C[m,n] = A[m,k]*B[k,n': expected ']' to close B[ at column 22"),
    (["C[m,n] = A[m,k]*B[k,n]", "E[m,n] = C[m,l] D[l,n]"],
     "equation 2 'E[m,n] = C[m,l] D[l,n]': expected '*' or the end, found 'D' at column 17"),
    (["C[m,n] = A[m,k]*B[k,2*n+]"], "equation 1 'C[m,n] = A[m,k]*B[k,2*n+]': B index 1: expected a loop name or an "
                                    "integer at column 25"),
    (["C[m,n] A[m,k]"], "equation 1 'C[m,n] A[m,k]': expected '=' after the output, found 'A' at column 8"),
    (["C[2*m,n] = A[m,k]*B[k,n]"], "equation 1 'C[2*m,n] = A[m,k]*B[k,n]': output C index 0 '2*m' must be one loop at column 3"),
    (["C[m,n] = A[m,k-kk]*B[k,n]"], "loop 'kk' is subtracted; coefficients must be positive at column 15"),
    (["C[m,n] = A[m,k]*B[k,n]", "D[m,n] = A[k,m]*C[m,n]"], "equation 2: tensor A is indexed [k,m] here but [m,k] before"),
    (["C[m,n] = A[m,q]*B[q,n]"], "equation 1: no extent for loop(s) ['q'] (give them in dims)"),
])
def test_equation_errors_name_the_equation_and_column(equations, message):
    with pytest.raises(InvalidInput) as err:
        workload_from_equations(equations, {"m": 4, "n": 4, "k": 4})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_outputs_take_plain_loops_and_inputs_a_fitting_shape():
    with pytest.raises(ValueError, match="tensor 'I' dim 0 'oh-5' never reaches index 0; give its shape"):
        Workload(dims={"oh": 3}, tensors={"I": {"dims": ["oh-5"]}, "O": {"dims": ["oh"]}},
                 ops=[{"name": "o", "loops": ["oh"], "inputs": ["I"], "output": "O"}])
    with pytest.raises(ValueError, match="tensor 'I' dim 0 is loop 'm' of extent 3, but its shape says 4"):
        Workload(dims={"m": 3}, tensors={"I": {"dims": ["m"], "shape": [4]}, "O": {"dims": ["m"]}},
                 ops=[{"name": "o", "loops": ["m"], "inputs": ["I"], "output": "O"}])


def test_conv2d_builder():
    w = builtin("conv2d", {"n": 2, "c": 8, "h": 15, "w": 13, "k": 16, "r": 3, "s": 3},
                params={"stride": 2, "pad": 1, "dilation": 2})
    assert w.dims == {"n": 2, "k": 16, "oh": 7, "ow": 6, "c": 8, "kh": 3, "kw": 3}
    assert w.tensors["I"].dims == ["n", "c", "2*oh+2*kh-1", "2*ow+2*kw-1"] and w.shape("I") == [2, 8, 15, 13]
    dw = builtin("conv2d", {"n": 1, "c": 32, "h": 7, "w": 7, "r": 3, "s": 3},
                 params={"groups": 32, "pointwise": 64, "layout": "nhwc", "pad": 1})
    assert [op.name for op in dw.ops] == ["depthwise", "pointwise"] and dw.tensors["T"].role == "intermediate"
    assert {n: t.dims for n, t in dw.tensors.items() if n != "I"} == {
        "W": ["kh", "kw", "c"], "T": ["n", "oh", "ow", "c"], "V": ["c", "f"], "O": ["n", "oh", "ow", "f"]}
    with pytest.raises(InvalidInput, match="conv2d: groups 3 must divide both C 8 and K 8"):
        builtin("conv2d", {"n": 1, "c": 8, "h": 7, "w": 7, "k": 8, "r": 3, "s": 3}, params={"groups": 3})


def test_the_service_and_files_accept_the_same_forms():
    conv = {"kind": "conv2d", "dims": {"n": 1, "c": 4, "h": 9, "w": 9, "k": 4, "r": 3, "s": 3}, "stride": 2}
    assert PlanRequest(workload=conv).workload == workload_from_dict(conv)
    eqs = {"equations": ["C[m,l] = A[m,k]*B[k,l]", "E[m,n] = C[m,l]*D[l,n]"], "dims": {"m": 8, "l": 8, "k": 4, "n": 4}}
    assert PlanRequest(workload=eqs).workload == workload_from_dict(eqs)
