"""The pure parts of the cloud adapters: credentials from each provider's usual place, and
each provider's records mapped onto offers, states and SSH addresses."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr
from traind.launch.providers.lambda_cloud import api as lambda_api
from traind.launch.providers.nebius import api as nebius_api
from traind.launch.providers.runpod import api as runpod_api

from traind.errors import ConfigError
from traind.launch.base import HostState
from traind.launch.credentials import api_key, assignment_key, toml_key


def test_key_order_is_file_then_environment_then_cli_file(tmp_path: Path) -> None:
    """launch.toml's key wins, then the environment variable, then the CLI's file."""
    cli = tmp_path / "config.toml"
    cli.write_text('apikey = "from-cli"\n')
    got = api_key(SecretStr("from-toml"), "runpod", "RUNPOD_API_KEY", [cli], toml_key,
                  {"RUNPOD_API_KEY": "from-env"})
    assert got.get_secret_value() == "from-toml"
    got = api_key(None, "runpod", "RUNPOD_API_KEY", [cli], toml_key, {"RUNPOD_API_KEY": "e"})
    assert got.get_secret_value() == "e"
    assert api_key(None, "runpod", "RUNPOD_API_KEY", [cli], toml_key, {}).get_secret_value() \
        == "from-cli"
    assert "from-cli" not in repr(api_key(None, "x", "X", [cli], toml_key, {}))


def test_missing_key_names_every_place(tmp_path: Path) -> None:
    """Without a key anywhere the error names the variable and the files looked in."""
    with pytest.raises(ConfigError) as err:
        api_key(None, "lambda", "LAMBDA_API_KEY", [tmp_path / "lambda_keys"], assignment_key, {})
    assert "LAMBDA_API_KEY" in str(err.value.problems)
    assert "lambda_keys" in str(err.value.problems)


@pytest.mark.parametrize(("text", "key"), [
    ('apikey = "k1"\n', "k1"), ('api_key = "k2"\n', "k2"), ('[default]\napi_key = "k3"\n', "k3"),
    ("not toml [", None), ('other = "x"\n', None),
])
def test_runpod_config_toml(text: str, key: str | None) -> None:
    """runpodctl's ``apikey`` and the SDK's ``[default] api_key`` are both read."""
    assert toml_key(text) == key


def test_lambda_keys_file() -> None:
    """``api_key = KEY`` in ~/.lambda_cloud/lambda_keys, quotes or not."""
    assert assignment_key("# keys\napi_key = secret_abc\n") == "secret_abc"
    assert assignment_key("api_key='q'\n") == "q"
    assert assignment_key("other = 1\n") is None


GPUS = [
    {"id": "NVIDIA GeForce RTX 4090", "name": "RTX 4090", "memory": 24, "secure": True,
     "community": True, "price": {"secure": 0.69, "community": 0.34},
     "maxCount": {"secure": 8, "community": 4},
     "dataCenters": [{"id": "US-KS-2", "availability": "HIGH"},
                     {"id": "EU-RO-1", "availability": "NONE"}]},
    {"id": "NVIDIA A40", "name": "A40", "memory": 48, "secure": False, "community": True,
     "price": {"secure": 0.0, "community": 0.2}, "maxCount": {"secure": 0, "community": 2},
     "dataCenters": [{"id": "CA-MTL-1", "availability": "LOW"}]},
]


def test_runpod_offers_per_gpu_type_and_data_center() -> None:
    """An offer per data center with stock in the chosen cloud; the price is per GPU times
    the count; types that cannot hold the count are left out."""
    offers = runpod_api.offers_from(GPUS, "SECURE", 2, ())
    assert [(o.id, o.price_per_hour, o.num_gpus) for o in offers] == [
        ("NVIDIA GeForce RTX 4090@US-KS-2", pytest.approx(1.38), 2)]
    assert runpod_api.offers_from(GPUS, "COMMUNITY", 4, ())[0].location == "US-KS-2"
    assert [o.gpu_name for o in runpod_api.offers_from(GPUS, "COMMUNITY", 2, ("CA-MTL-1",))] \
        == ["A40"]


def test_runpod_ssh_address_from_the_port_mapping() -> None:
    """SSH goes to the public side of the 22/tcp mapping, else to ssh.direct, else nowhere."""
    pod = {"runtime": {"ports": [{"private": 8888, "public": 1, "ip": "h", "type": "http"},
                                 {"private": 22, "public": 34446, "ip": "195.26.233.3",
                                  "type": "tcp"}]}}
    assert runpod_api.ssh_address(pod, 22) == ("195.26.233.3", 34446)
    direct = {"runtime": None, "ssh": {"direct": {"host": "1.2.3.4", "port": 40022}}}
    assert runpod_api.ssh_address(direct, 22) == ("1.2.3.4", 40022)
    assert runpod_api.ssh_address({"runtime": None, "ssh": {"direct": None}}, 22) is None
    assert runpod_api.normalise_state({"status": "STARTING"}) is HostState.LOADING
    assert runpod_api.message({"title": "Bad Request", "status": 400, "detail": "no capacity",
                               "errors": ["x"]}) == "no capacity (x)"


def test_lambda_gpu_descriptions() -> None:
    """Lambda's ``gpu_description`` gives the model with its form factor and the memory."""
    assert lambda_api.gpu_model("H100 (80 GB SXM5)") == ("H100 SXM5", 80.0)
    assert lambda_api.gpu_model("A10 (24 GB PCIe)") == ("A10 PCIe", 24.0)
    assert lambda_api.gpu_model("GH200 Superchip") == ("GH200 Superchip", 0.0)


def test_lambda_offers_only_where_there_is_capacity() -> None:
    """An offer per region with capacity, priced from cents; ``regions`` narrows them."""
    types = {"gpu_1x_a10": {"instance_type": {
        "name": "gpu_1x_a10", "gpu_description": "A10 (24 GB PCIe)", "price_cents_per_hour": 75,
        "specs": {"gpus": 1, "storage_gib": 1400}},
        "regions_with_capacity_available": [{"name": "us-east-1"}, {"name": "us-west-1"}]},
        "gpu_8x_a100": {"instance_type": {"name": "gpu_8x_a100", "gpu_description": "A100 (40 GB "
                        "SXM4)", "price_cents_per_hour": 1032, "specs": {"gpus": 8}},
                        "regions_with_capacity_available": []}}
    offers = lambda_api.offers_from(types, ())
    assert [(o.id, o.price_per_hour) for o in offers] == [("gpu_1x_a10@us-east-1", 0.75),
                                                          ("gpu_1x_a10@us-west-1", 0.75)]
    assert [o.location for o in lambda_api.offers_from(types, ("us-west-1",))] == ["us-west-1"]
    assert lambda_api.message({"error": {"code": "global/quota-exceeded", "message": "Quota "
                               "exceeded.", "suggestion": "Contact Support."}}) == (
        "Quota exceeded. [global/quota-exceeded]; Contact Support.")


def test_nebius_mapping() -> None:
    """Vendor prefixes are dropped from GPU names, the /32 from addresses, and a failed
    call's code and details say whether to wait, give up on quota, or report capacity."""
    assert nebius_api.gpu_name("NVIDIA H100 NVLink", "", "gpu-h100-sxm") == "H100 NVLink"
    assert nebius_api.gpu_name("", "", "gpu-l40s-a") == "gpu-l40s-a"
    assert nebius_api.public_address(["", "195.242.10.1/32"]) == "195.242.10.1"
    assert nebius_api.kind_of("RESOURCE_EXHAUSTED", {"too_many_requests": True}) == "rate"
    assert nebius_api.kind_of("RESOURCE_EXHAUSTED", {"quota_failure": True}) == "quota"
    assert nebius_api.kind_of("RESOURCE_EXHAUSTED", {"not_enough_resources": True}) == \
        "capacity"
    assert nebius_api.kind_of("UNAVAILABLE", {}) == "transient"
    assert nebius_api.normalise_state("DELETING") is HostState.STOPPED
    assert "      - ssh-ed25519 AAAA k\n" in nebius_api.cloud_init("ubuntu", "ssh-ed25519 AAAA k")
