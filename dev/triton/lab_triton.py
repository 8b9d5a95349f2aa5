"""lab_triton.py: the @triton.jit helpers the dev/triton scripts share. Imported after lab_common.require()
(it imports triton, which a script without one must not reach)."""
import triton
import triton.language as tl


@triton.jit
def mma(a, b, UPCAST: tl.constexpr):
    """a @ b of bf16 tiles, fp32 result. UPCAST (Triton's CPU interpreter only, whose bf16 tl.dot is not
    trustworthy): the same products of the same bf16 values in fp32."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b)
