"""The names of the 44 released ELMoForManyLangs models (``manylangs/<code>``) and the URL of
each one's archive: the hub's knowledge of them, which is names and URLs only.  Reading and
converting such a model is :mod:`elmo_jax.formats.manylangs`'s."""

from __future__ import annotations

import difflib
import os

# The 44 released models: short name (ISO 639-1, else 639-3) -> (NLPL repository id, language).
# From the download table of the ELMoForManyLangs README (github.com/HIT-SCIR/ELMoForManyLangs,
# also the PyPI description of elmoformanylangs 0.0.4.post2), files at
# http://vectors.nlpl.eu/repository/11/<id>.zip.  "zh" is the traditional-Chinese Wikipedia model.
RELEASED = {
    "ar": (136, "Arabic"),
    "bg": (137, "Bulgarian"),
    "ca": (138, "Catalan"),
    "cs": (139, "Czech"),
    "cu": (140, "Old Church Slavonic"),
    "da": (141, "Danish"),
    "de": (142, "German"),
    "el": (143, "Greek"),
    "en": (144, "English"),
    "es": (145, "Spanish"),
    "et": (146, "Estonian"),
    "eu": (147, "Basque"),
    "fa": (148, "Persian"),
    "fi": (149, "Finnish"),
    "fr": (150, "French"),
    "ga": (151, "Irish"),
    "gl": (152, "Galician"),
    "grc": (153, "Ancient Greek"),
    "he": (154, "Hebrew"),
    "hi": (155, "Hindi"),
    "hr": (156, "Croatian"),
    "hu": (157, "Hungarian"),
    "id": (158, "Indonesian"),
    "it": (159, "Italian"),
    "ja": (160, "Japanese"),
    "ko": (161, "Korean"),
    "la": (162, "Latin"),
    "lv": (163, "Latvian"),
    "nl": (164, "Dutch"),
    "nb": (165, "Norwegian Bokmål"),
    "nn": (166, "Norwegian Nynorsk"),
    "pl": (167, "Polish"),
    "pt": (168, "Portuguese"),
    "ro": (169, "Romanian"),
    "ru": (170, "Russian"),
    "sk": (171, "Slovak"),
    "sl": (172, "Slovene"),
    "sv": (173, "Swedish"),
    "tr": (174, "Turkish"),
    "ug": (175, "Uyghur"),
    "uk": (176, "Ukrainian"),
    "ur": (177, "Urdu"),
    "vi": (178, "Vietnamese"),
    "zh": (179, "Chinese (traditional)"),
}
NAME_PREFIX = "manylangs/"
DEFAULT_URL = "http://vectors.nlpl.eu/repository/11/"
URL_ENV = "ELMO_JAX_MANYLANGS_URL"


def released_names() -> list[str]:
    return [NAME_PREFIX + code for code in RELEASED]


def close_codes(text: str) -> list[str]:
    """Released language codes that ``text`` may mean: the code itself in any case, else the
    codes of languages whose name is ``text`` or close to it, else close codes."""
    text = text.strip().lower()
    if text in RELEASED:
        return [text]
    by_language = {language.lower(): code for code, (_, language) in RELEASED.items()}
    languages = difflib.get_close_matches(text, by_language, n=3, cutoff=0.75)
    if languages:
        return [by_language[name] for name in languages]
    return difflib.get_close_matches(text, RELEASED, n=3, cutoff=0.5)


def released_url(name: str, base: str | None = None) -> str:
    """The archive URL of a released name (``manylangs/fr``); ``$ELMO_JAX_MANYLANGS_URL`` or
    ``base`` replaces the NLPL repository (a mirror)."""
    base = base or os.environ.get(URL_ENV) or DEFAULT_URL
    return f"{base.rstrip('/')}/{RELEASED[name[len(NAME_PREFIX) :]][0]}.zip"


__all__ = ["DEFAULT_URL", "NAME_PREFIX", "RELEASED", "URL_ENV", "close_codes", "released_names", "released_url"]
