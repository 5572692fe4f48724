"""Import check dims for a dim with no small-fraction divisor, over a wrapper that pads to its blocks."""

from __future__ import annotations

from conftest import TEST_KERNELS

from pallasopt.adapters.check_dims import import_check_dims

PADDED = TEST_KERNELS / "styles" / "padded_matmul.py"


def test_a_prime_dim_over_a_padding_wrapper_shrinks_to_a_power_of_two() -> None:
    # N = 1931 (prime) is neither halved (odd) nor a fraction a/b of itself with b <= 16; the wrapper pads N to BN,
    # so 256 (two 128-column blocks, the smallest power of two keeping >= 2 steps) is a faithful stand-in. Without
    # CHECK_DIMS in the text, the import derives them; before, N stayed 1931 (JAXBench's 8_Matmul_with_irregular_
    # shapes_ kept N = 5921 = 31 x 191: its check took 82 s on a loaded machine).
    text = PADDED.read_text().replace("N=1100", "N=1931").replace("CHECK_DIMS = ", "_UNUSED = ")
    dims = import_check_dims(text, str(PADDED))
    assert dims is not None and dims["N"] == 256, dims
