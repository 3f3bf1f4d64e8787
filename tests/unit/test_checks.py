"""pflkit.checks: one check of an integer argument for every layer, naming the argument and what it allows."""
import pytest

from pflkit.checks import check_int, check_positive


@pytest.mark.parametrize("value", [0, -3, True, 1.0, "2", None])
def test_check_int_refuses_what_is_not_an_integer_at_least_the_minimum(value):
    with pytest.raises(ValueError, match=rf"^rounds must be an integer >= 1, got {value!r}$"):
        check_int("rounds", value, 1)


def test_check_int_returns_the_value_and_names_the_allowed_values_given():
    assert check_int("seed", 0, 0) == 0 and check_int("rounds", 7, 1) == 7
    with pytest.raises(ValueError, match=r"^min_clients must be None \(every client\) or an integer >= 1, got 0$"):
        check_int("min_clients", 0, 1, "None (every client) or an integer >= 1")


def test_check_positive_integer_and_number_forms():
    assert check_positive("lr", 0.5) == 0.5 and check_positive("steps", 0, integer=True, allow_zero=True) == 0
    with pytest.raises(ValueError, match=r"^lr must be a number > 0, got 0$"):
        check_positive("lr", 0)
    with pytest.raises(ValueError, match=r"^steps must be an integer >= 0, got 1.5$"):
        check_positive("steps", 1.5, integer=True, allow_zero=True)
    with pytest.raises(ValueError, match=r"^lr must be a number > 0, got True$"):
        check_positive("lr", True)
