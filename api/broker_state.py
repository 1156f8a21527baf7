"""The one-machine broker as `sealed up` runs it: its settings, its expected simulated measurement
(workers pin it), and its sealed keys opened with the simulated platform key.

Opening the broker's state outside the broker (to provision the demo tenant, or for `sealed keys
import`) works only because the simulated platform key is a file of the operator's: the simulated
TEE protects nothing against the operator (docs/security.md). On SNP nothing outside the broker can.
"""

from __future__ import annotations

from api.home import Home, ed25519_key, write_public_key
from key_broker.attested import instance_id
from key_broker.measurement import simulated_measurement
from key_broker.sealed_keys import SEALED_KEYS_FILE, BrokerKeys, open_sim_keys_offline
from key_broker.settings import BrokerSettings
from key_broker.statefile import local_ledger


def broker_settings(home: Home) -> BrokerSettings:
    """The measured part of the settings `launch` starts the broker with (its command line)."""
    return BrokerSettings(data_dir=home.broker, tee="sim", sim_platform_signing_key=home.sim_key,
                          sim_platform_public_key=home.sim_public_key)


def broker_measurement(home: Home) -> bytes:
    """The simulated measurement the demo broker computes over its own code and configuration."""
    return simulated_measurement(broker_settings(home))


def local_broker_keys(home: Home) -> BrokerKeys:
    """The broker's keys. A home without them gets a fresh broker: keys made and sealed to the demo
    broker's measurement, and its state ledger initialised with its anchor (the demo's explicit
    initialisation, issue #46: a new instance identity). Keys present, the anchor must be too."""
    platform = ed25519_key(home.sim_key)
    if not home.sim_public_key.exists():
        write_public_key(platform, home.sim_public_key)
    fresh = not (home.broker / SEALED_KEYS_FILE).exists()
    keys = open_sim_keys_offline(home.broker, platform, broker_measurement(home))
    if fresh:
        local_ledger(home.broker, keys.master_key).initialise()
    return keys


def demo_broker_instance(home: Home) -> str | None:
    """The demo broker's instance id (its attested instance key, hex), once it was initialised."""
    if not (home.broker / SEALED_KEYS_FILE).exists():
        return None
    return instance_id(local_broker_keys(home).instance_key.public_key())
