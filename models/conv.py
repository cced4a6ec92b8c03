"""2-D convolutions as equations (models/einsum.py), optionally fused with a 1x1 conv.

    O[n,k,oh,ow] = I[n,c,S*oh+D*kh-P, S*ow+D*kw-P] * W[k,c,kh,kw]        (nchw)
    O[n,oh,ow,k] = I[n,S*oh+D*kh-P, S*ow+D*kw-P, c] * W[kh,kw,c,k]        (nhwc)

with OH = (H + 2P - D(R-1) - 1) // S + 1 (likewise OW). The input is read
through its zero-padded copy (indices outside [0, H) read zero). Groups split
the channels: each of G groups convolves C/G input channels into K/G outputs
(loops g, c, k; a per-group loop of extent 1 is dropped, so depthwise, G = C =
K, runs loops n, c, oh, ow, kh, kw). A window of one tap (R or S = 1) has no
kh or kw loop: a 1x1 conv with stride 1 is a GEMM over plain loops. `pointwise=F` fuses a 1x1 conv from the
K channels to F after it (conv -> 1x1, or MobileNet's depthwise -> pointwise):
the conv's output tile is exactly the 1x1 conv's input tile, so no halo is
recomputed and the intermediate never reaches memory.
"""
from __future__ import annotations

from .errors import InvalidInput

LAYOUTS = ("nchw", "nhwc")


def _affine(stride: int, dilation: int, pad: int, out: str, kern: str | None) -> str:
    term = lambda c, x: x if c == 1 else f"{c}*{x}"  # noqa: E731
    window = f"+{term(dilation, kern)}" if kern else ""
    return f"{term(stride, out)}{window}" + (f"-{pad}" if pad else "")


def output_size(size: int, window: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (window - 1) - 1) // stride + 1


def conv2d(sizes: dict[str, int], stride: int = 1, pad: int = 0, dilation: int = 1, layout: str = "nchw",
           groups: int = 1, pointwise: int | None = None) -> tuple[list[str], dict[str, int], dict[str, list[int]]]:
    """Equations, loop extents and stored input shapes of a conv2d (see the module docstring).
    `sizes` has n, c, h, w, k, r, s."""
    n, c, h, w, k, r, s = (sizes[x] for x in "nchwkrs")
    if layout not in LAYOUTS:
        raise InvalidInput(f"conv2d: unknown layout {layout!r}; expected {' or '.join(LAYOUTS)}")
    for name, value, low in (("stride", stride, 1), ("dilation", dilation, 1), ("groups", groups, 1), ("pad", pad, 0)):
        if not isinstance(value, int) or value < low:
            raise InvalidInput(f"conv2d: {name} must be an integer >= {low}, got {value!r}")
    if pointwise is not None and (not isinstance(pointwise, int) or pointwise < 1):
        raise InvalidInput(f"conv2d: pointwise must be an integer >= 1, got {pointwise!r}")
    if c % groups or k % groups:
        raise InvalidInput(f"conv2d: groups {groups} must divide both C {c} and K {k}")
    oh, ow = output_size(h, r, stride, pad, dilation), output_size(w, s, stride, pad, dilation)
    if oh < 1 or ow < 1:
        raise InvalidInput(f"conv2d: the {r}x{s} window with dilation {dilation} does not fit the {h}x{w} input "
                           f"padded by {pad}")
    # Channel loops: (group, input per group, output per group), extent-1 ones dropped;
    # depthwise (one input and one output channel per group) runs one loop, c.
    g, cg, kg = groups, c // groups, k // groups
    if g == 1:
        chans, cin, cout = {"c": c, "k": k}, ["c"], ["k"]
    elif cg == 1 and kg == 1:
        chans, cin, cout = {"c": c}, ["c"], ["c"]
    else:
        chans = {"g": g} | ({"c": cg} if cg > 1 else {}) | ({"k": kg} if kg > 1 else {})
        cin, cout = ["g"] + (["c"] if cg > 1 else []), ["g"] + (["k"] if kg > 1 else [])
    reduce_c = [x for x in cin if x not in cout]
    # A window of one tap has no loop: a 1x1 conv with stride 1 is a GEMM over plain loops.
    kh, kw = ("kh" if r > 1 else None), ("kw" if s > 1 else None)
    ih, iw = _affine(stride, dilation, pad, "oh", kh), _affine(stride, dilation, pad, "ow", kw)
    taps = [x for x in (kh, kw) if x]
    dims = {"n": n, **chans, "oh": oh, "ow": ow, **({"kh": r} if kh else {}), **({"kw": s} if kw else {})}
    # Arrays as PyTorch (nchw: weights K, C/G, R, S) or TensorFlow (nhwc: weights R, S, C/G, K) store them.
    if layout == "nchw":
        inp, out, wts = ["n", *cin, ih, iw], ["n", *cout, "oh", "ow"], [*cout, *reduce_c, *taps]
        in_shape = [n, *[chans[x] for x in cin], h, w]
    else:
        inp, out, wts = ["n", ih, iw, *cin], ["n", "oh", "ow", *cout], [*taps, *reduce_c, *cout]
        in_shape = [n, h, w, *[chans[x] for x in cin]]
    ref = lambda name, ix: f"{name}[{','.join(ix)}]"  # noqa: E731
    conv_name = "depthwise" if cin == cout == ["c"] else "conv"
    if pointwise is None:
        return [f"{conv_name}: {ref('O', out)} = {ref('I', inp)}*{ref('W', wts)}"], dims, {"I": in_shape}
    dims["f"] = pointwise
    final = ["n", "f", "oh", "ow"] if layout == "nchw" else ["n", "oh", "ow", "f"]
    pw = ["f", *cout] if layout == "nchw" else [*cout, "f"]
    return [f"{conv_name}: {ref('T', out)} = {ref('I', inp)}*{ref('W', wts)}",
            f"pointwise: {ref('O', final)} = {ref('T', out)}*{ref('V', pw)}"], dims, {"I": in_shape}
