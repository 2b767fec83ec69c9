"""Our in-place scale kernel (engine/ops/gemm_output/cute_scale.py) against fp32 torch math (GPU).

The kernel promises the fp32 product of each element and the fp32 scalar, rounded once to the
element dtype. So the check is bitwise equality with `(x.float() * scale).to(x.dtype)` on fresh
random data, over shapes whose rows and columns do not fill a whole CTA tile (8 x 512), in bf16 and
fp16. Not with `x.mul_(scale)`: for a bf16 x, torch first casts a 0-dim fp32 tensor operand to
the common dtype bf16, so its result carries the scalar's bf16 rounding (up to 2^-9 relative;
measured on an H200: fp16 and scale -3.7 differ from the fp32 product).
"""

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(73, 1000), (1030, 4096), (1, 8)])
@pytest.mark.parametrize("value", [1.0 / 8191, -3.7])
def test_scale_is_the_fp32_product_rounded_once(dtype, shape, value):
    from engine.ops.gemm_output.cute_scale import scale_

    g = torch.Generator(device="cuda").manual_seed(shape[0])
    x = torch.randn(*shape, generator=g, device="cuda").to(dtype)
    scale = torch.tensor(value, device="cuda")
    want = (x.float() * scale).to(dtype)
    got = x.clone()
    assert scale_(got, scale) is not None
    assert torch.equal(got, want)


def test_scale_rejects_what_it_cannot_do():
    from engine.ops.gemm_output.cute_scale import scale_

    x = torch.zeros(4, 16, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous"):
        scale_(x.t(), torch.tensor(2.0, device="cuda"))
    with pytest.raises(ValueError, match="fp32"):
        scale_(x, torch.tensor(2.0, device="cuda", dtype=torch.float64))
