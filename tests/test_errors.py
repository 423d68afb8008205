"""The one line an error is told in."""

from __future__ import annotations

from relay_tasks.errors import describe_text


def test_a_tvm_error_is_told_by_the_message_after_its_backtrace() -> None:
    text = ("Traceback (most recent call last):\n  1: tvm::relay::Foo()\n  0: Bar\n"
            "  File \"x.cc\", line 3\nTVMError: Check failed: (a == b) is false: shapes differ\n")  # fmt: skip
    assert describe_text(text) == "TVMError: Check failed: (a == b) is false: shapes differ"


def test_an_xgboost_error_is_told_by_the_message_before_its_backtrace() -> None:
    text = ("[16:27:32] ../src/learner.cc:1510: Check failed: num_feature >= num_col_ (426 vs. "
            "468) : Number of columns does not match number of features in booster.\n"
            "Stack trace:\n  [bt] (0) /x/libxgboost.so(+0x22dbbc) [0x7f]\n"
            "  [bt] (8) /x/_ctypes.so(+0x1111a) [0x7f]\n\n")  # fmt: skip
    assert describe_text(text).endswith("Number of columns does not match number of features in "
                                        "booster.")  # fmt: skip
