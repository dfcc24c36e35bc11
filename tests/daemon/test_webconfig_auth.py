"""Basic auth must not tell a configured user name from an unknown one: an unknown user is checked against a
dummy hash of the configured cost (the highest configured), so both cost one bcrypt check of that cost. No timing
is measured here: the cost is read from the hashes, and the hash an unknown user is checked against is seen."""
import base64

import bcrypt
import pytest
import yaml

from fleetcanary.daemon import webconfig


def cost(hashed: bytes) -> int:
    """The cost of a bcrypt hash $2b$NN$..."""
    return int(hashed[4:6])


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def load_users(tmp_path, costs: dict[str, int]):
    users = {u: bcrypt.hashpw(f"pw-{u}".encode(), bcrypt.gensalt(rounds=c)).decode().replace("$2b$", "$2y$")
             for u, c in costs.items()}
    (tmp_path / "web.yml").write_text(yaml.safe_dump({"basic_auth_users": users}))
    return webconfig.load(str(tmp_path / "web.yml"))


@pytest.fixture
def checked(monkeypatch):
    """Every hash bcrypt.checkpw is called with, in order."""
    seen = []
    real = bcrypt.checkpw

    def spy(password, hashed):
        seen.append(hashed)
        return real(password, hashed)
    monkeypatch.setattr(bcrypt, "checkpw", spy)
    return seen


@pytest.mark.parametrize("costs", [{"prometheus": 4}, {"prometheus": 12}, {"a": 5, "b": 11, "c": 4}])
def test_an_unknown_user_is_checked_at_the_configured_cost(tmp_path, checked, costs):
    wc = load_users(tmp_path, costs)
    top = max(costs.values())
    for attempt in ("nobody", "Prometheus", "prometheus ", "x" * 300, ""):  # 5 unknown names
        assert wc.check_authorization(header(attempt, "pw-prometheus")) is False
    assert len(checked) == 5
    for hashed in checked:
        assert cost(hashed) == top, hashed[:7]
        assert hashed not in wc.users.values()  # the dummy, never a real user's hash


def test_a_known_user_is_checked_against_its_own_hash(tmp_path, checked):
    wc = load_users(tmp_path, {"a": 4, "b": 6})
    assert wc.check_authorization(header("a", "wrong")) is False
    assert wc.check_authorization(header("a", "pw-a")) is True
    assert checked == [wc.users["a"], wc.users["a"]]
    assert cost(wc.dummy_hash) == 6
    assert wc.check_authorization(header("a", "pw-a")) is True  # cached: no further bcrypt
    assert len(checked) == 2


def test_a_hash_with_an_impossible_cost_is_refused(tmp_path):
    (tmp_path / "web.yml").write_text(yaml.safe_dump({"basic_auth_users": {"p": "$2y$99$" + "a" * 53}}))
    with pytest.raises(webconfig.WebConfigError, match="not a bcrypt hash"):
        webconfig.load(str(tmp_path / "web.yml"))
