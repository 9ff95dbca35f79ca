#!/usr/bin/env python
"""Write a small RAVEL city file set for real pretrained models (docs/ravel.md, "On a real model").

RAVEL's own files (Huang et al. 2024) are not reachable offline. This writes, in their format, 52 well-known cities of
Europe, Asia and Africa with three attributes (country, continent, language) and two or three prompt templates per
attribute, every value one token after a space for Gemma 3 and SmolLM2 (checked by ``tests/unit/test_ravel_cities.py``):

    python scripts/ravel_cities.py DIR            # DIR/ravel_city_entity_attributes.json, ..._attribute_to_prompts.json
    cprobe run +experiment=ravel dataset=ravel dataset.path=DIR model=gemma3_270m layers=6

The facts are general knowledge written for this check (the country a city is in, its continent, the language most of
its people speak), not a copy of RAVEL's data. The writer refuses to overwrite files holding other data: both names
are checked before either is written.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cprobe.io import atomic_write_bytes

CITIES: dict[str, dict[str, tuple[str, str]]] = {
    "Europe": {
        "Paris": ("France", "French"), "Lyon": ("France", "French"), "Marseille": ("France", "French"),
        "Berlin": ("Germany", "German"), "Munich": ("Germany", "German"), "Hamburg": ("Germany", "German"),
        "Madrid": ("Spain", "Spanish"), "Barcelona": ("Spain", "Spanish"), "Seville": ("Spain", "Spanish"),
        "Rome": ("Italy", "Italian"), "Milan": ("Italy", "Italian"), "Naples": ("Italy", "Italian"),
        "Lisbon": ("Portugal", "Portuguese"), "Porto": ("Portugal", "Portuguese"), "Moscow": ("Russia", "Russian"),
        "Warsaw": ("Poland", "Polish"), "Krakow": ("Poland", "Polish"), "Athens": ("Greece", "Greek"),
        "Amsterdam": ("Netherlands", "Dutch"), "Rotterdam": ("Netherlands", "Dutch"), "Vienna": ("Austria", "German"),
        "Stockholm": ("Sweden", "Swedish"), "Oslo": ("Norway", "Norwegian"), "Helsinki": ("Finland", "Finnish"),
        "Budapest": ("Hungary", "Hungarian"), "Dublin": ("Ireland", "English"), "London": ("England", "English"),
        "Manchester": ("England", "English"),
    },
    "Asia": {
        "Tokyo": ("Japan", "Japanese"), "Osaka": ("Japan", "Japanese"), "Kyoto": ("Japan", "Japanese"),
        "Beijing": ("China", "Chinese"), "Shanghai": ("China", "Chinese"), "Bangkok": ("Thailand", "Thai"),
        "Jakarta": ("Indonesia", "Indonesian"), "Hanoi": ("Vietnam", "Vietnamese"), "Tehran": ("Iran", "Persian"),
        "Baghdad": ("Iraq", "Arabic"), "Istanbul": ("Turkey", "Turkish"), "Ankara": ("Turkey", "Turkish"),
        "Manila": ("Philippines", "Filipino"), "Karachi": ("Pakistan", "Urdu"), "Lahore": ("Pakistan", "Urdu"),
    },
    "Africa": {
        "Cairo": ("Egypt", "Arabic"), "Alexandria": ("Egypt", "Arabic"), "Lagos": ("Nigeria", "English"),
        "Casablanca": ("Morocco", "Arabic"), "Algiers": ("Algeria", "Arabic"), "Tunis": ("Tunisia", "Arabic"),
        "Accra": ("Ghana", "English"), "Dakar": ("Senegal", "French"), "Khartoum": ("Sudan", "Arabic"),
    },
}

PROMPTS: dict[str, list[str]] = {
    "country": ["%s is a city in the country of", "%s is located in the country of",
                "The city of %s is in the country of"],
    "continent": ["%s is a city on the continent of", "%s is located on the continent of"],
    "language": ["In %s, most people speak", "The main language spoken in %s is", "People in %s speak"],
}


def entities() -> dict[str, dict[str, str]]:
    """``{city: {attribute: value}}`` in RAVEL's ``entity_attributes`` shape."""
    return {city: {"country": country, "continent": continent, "language": language}
            for continent, cities in CITIES.items() for city, (country, language) in cities.items()}


def write(folder: Path, entity_type: str = "city") -> list[Path]:
    """The two files under ``folder``. Every name is checked before anything is written: one already there is
    replaced only if it holds what this writes, else nothing is written. Each goes through cprobe's atomic writer
    (a temporary ``.<name>.<random>.cprobe-tmp`` of its own, made with exclusive creation)."""
    files = {folder / f"ravel_{entity_type}_{suffix}.json": (json.dumps(data, indent=1, ensure_ascii=False) + "\n")
             .encode() for suffix, data in (("entity_attributes", entities()), ("attribute_to_prompts", PROMPTS))}
    for path, data in files.items():
        if path.is_symlink() or (path.exists() and (not path.is_file() or path.read_bytes() != data)):
            raise SystemExit(f"error: {path} exists and holds other data; nothing was written: pick another folder")
    for path, data in files.items():
        atomic_write_bytes(path, data)
    return list(files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="where the two JSON files go (dataset.path)")
    for path in write(ap.parse_args().folder):
        print(path)


if __name__ == "__main__":
    main()
