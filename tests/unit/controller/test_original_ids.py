"""The original OmniRT's model ids against the built-in catalog.

`tests/fixtures/original_registry_ids.json` lists every id of the original's registry (derived
from its source) with its tasks, default weights and diffusers pipelines, and what it is here:
the catalog entry it resolves to, or why it is not served and the model named instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from omnirt._internal import families
from omnirt.cli.models import ORIGINAL_IDS
from omnirt.controller.core.catalog import Catalog, CatalogError, NotServed, load_not_served
from omnirt.errors import ModelNotFound
from omnirt.types import ModelSpec, Task

FIXTURE = json.loads((Path(__file__).parents[2] / "fixtures" / "original_registry_ids.json").read_text())
IDS: dict[str, dict[str, Any]] = FIXTURE["ids"]
SERVED = sorted(k for k, v in IDS.items() if "served_as" in v)
NOT_SERVED = sorted(k for k, v in IDS.items() if "not_served" in v)
CATALOG = Catalog.load()
FAMILIES = families.builtin()
# The original's tasks -> ours ("edit" runs an edit model's image-to-image here).
TASKS = {task.value: task for task in Task} | {"edit": Task.IMAGE2IMAGE}


def test_the_fixture_holds_the_original_registry_and_the_cli_knows_it() -> None:
    # 60 ids and flux2-dev, the original's one alias (of flux2.dev).
    assert len(IDS) == 61 and sum("alias_of" in v for v in IDS.values()) == 1
    assert set(SERVED) | set(NOT_SERVED) == set(IDS) and not set(SERVED) & set(NOT_SERVED)
    assert frozenset(IDS) == ORIGINAL_IDS


@pytest.mark.parametrize("name", SERVED)
def test_a_served_id_resolves_to_the_same_weights_and_pipeline(name: str) -> None:
    row = IDS[name]
    spec = CATALOG.resolve(name)
    assert spec.id == row["served_as"]
    # The same weights: the original's default source, or (where the Hub moved it) the copy.
    assert spec.source == row.get("source_here", row["source"])
    family = FAMILIES[spec.family]
    for task in (TASKS[t] for t in row["tasks"]):
        assert task in spec.tasks, f"{name}: {spec.id} does not do {task.value}"
        # The same diffusers pipeline for that task as the original loaded.
        assert family.pipelines[task] in row["diffusers"], (name, task, family.pipelines[task])


@pytest.mark.parametrize("name", NOT_SERVED)
def test_an_id_not_served_is_not_found_naming_the_closest_model(name: str) -> None:
    row = IDS[name]
    with pytest.raises(ModelNotFound) as info:
        CATALOG.resolve(name)
    message = str(info.value)
    assert f"model '{name}' is an id of the original OmniRT that this build does not serve" in message
    assert row["not_served"] in message and "docs/migrating.md" in message
    assert info.value.field == "model"
    if "closest" in row:
        closest = CATALOG.resolve(row["closest"])  # a model served here, by its id
        assert closest.id == row["closest"]
        assert f"the closest here is '{row['closest']}'" in message
    else:
        assert "closest" not in message


def test_the_not_served_table_is_the_fixtures() -> None:
    hub = Path(__file__).parents[3] / "controller" / "core" / "hub.toml"
    assert sorted(row.id for row in load_not_served(hub)) == NOT_SERVED


def test_no_name_of_the_catalog_is_taken_twice() -> None:
    names = [name for spec in CATALOG for name in (spec.id, *spec.aliases)]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)


def test_a_catalog_entry_of_an_id_not_served_serves_it() -> None:
    row = NotServed(id="soulx-flashtalk-14b", reason="its own runtime", closest="mine")
    mine = ModelSpec(id="mine", tasks=[Task.AUDIO2VIDEO])
    catalog = Catalog([mine], not_served=[row])
    with pytest.raises(ModelNotFound, match="original OmniRT"):
        catalog.resolve("soulx-flashtalk-14b")
    catalog.add(ModelSpec(id="flashtalk", aliases=["soulx-flashtalk-14b"], tasks=[Task.AUDIO2VIDEO]))
    assert catalog.resolve("soulx-flashtalk-14b").id == "flashtalk"
    with pytest.raises(ModelNotFound, match="not found; did you mean"):  # others: as before
        catalog.resolve("flashtalk-14b")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('id = "x"', "needs an `id` and a `reason`"),
        ('id = "x"\nreason = "r"\ncolour = "red"', "unknown keys ['colour']"),
        ('id = "x"\nreason = "r"\nclosest = 3', "are strings"),
    ],
)
def test_a_malformed_not_served_row_names_the_file_and_the_id(
    tmp_path: Path, table: str, message: str
) -> None:
    path = tmp_path / "hub.toml"
    path.write_text(f"[[original_not_served]]\n{table}\n")
    with pytest.raises(CatalogError, match="original_not_served") as info:
        load_not_served(path)
    assert message in str(info.value) and str(path) in str(info.value)
