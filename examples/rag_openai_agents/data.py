"""A fictional encyclopedia and questions about it, generated reproducibly from a seed.

Every person, company and city is invented (names built from syllables), so a model cannot know the
answers: it has to search. Each company has a founder, a headquarters city, a product and a founding
year; each founder has a birth city and a profession. Questions need one lookup ("Who founded Brenvik
Works?") or two ("In which city was the founder of Brenvik Works born?").

Train and test questions are about different companies (and so different founders): the split is by
entity, so a trained model cannot pass the test by remembering answers it saw in training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from lightning_sdk.examples.rag_openai_agents.search import build_index

__all__ = [
    "Company",
    "Person",
    "World",
    "build_tasks",
    "make_questions",
    "make_world",
    "passages",
    "split_tasks",
]

_ONSETS = ["b", "br", "d", "dr", "f", "g", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t", "v", "z"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "k", "m"]
_FIRST_NAMES = [
    "Mira",
    "Tomas",
    "Ilse",
    "Jonah",
    "Petra",
    "Aldo",
    "Wren",
    "Nadia",
    "Oskar",
    "Lena",
    "Rafe",
    "Greta",
    "Silas",
    "Vera",
    "Emil",
    "Ida",
    "Hugo",
    "Runa",
    "Anton",
    "Cleo",
    "Bram",
    "Talia",
]
_COMPANY_KINDS = ["Works", "Labs", "Foundry", "Mills", "Systems", "Trading", "Brewing", "Motors"]
_CITY_ENDINGS = ["port", "ford", "vale", "holm", "burg", "wick", "stad", "mouth"]
_PRODUCTS = [
    "copper valves",
    "wool blankets",
    "paper lanterns",
    "glass beads",
    "bicycle bells",
    "clay pipes",
    "rope ladders",
    "tin whistles",
    "oak barrels",
    "silk scarves",
    "brass hinges",
    "wax candles",
    "leather boots",
    "stone tiles",
    "fishing nets",
    "garden tools",
    "wooden toys",
    "pocket clocks",
]
_PROFESSIONS = [
    "chemist",
    "sailor",
    "painter",
    "engineer",
    "baker",
    "teacher",
    "surgeon",
    "weaver",
    "pilot",
    "architect",
    "farmer",
    "lawyer",
    "carpenter",
    "astronomer",
    "poet",
    "banker",
]


@dataclass(frozen=True)
class Person:
    """An invented person: the founder of one company."""

    name: str
    birth_city: str
    profession: str


@dataclass(frozen=True)
class Company:
    """An invented company."""

    name: str
    founder: Person
    city: str
    product: str
    year: int


@dataclass(frozen=True)
class World:
    """Everything the encyclopedia describes; `seed` makes it again."""

    seed: int
    companies: tuple[Company, ...]
    cities: tuple[str, ...]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


def _fresh_word(rng: random.Random, taken: set[str], ending: str = "") -> str:
    """A new invented word; `taken` holds every word used so far, so no word names two entities
    (a search for one name then never matches another entity's entry)."""
    while True:
        word = (_word(rng, 2) + ending).capitalize()
        if word not in taken:
            taken.add(word)
            return word


def make_world(seed: int, companies: int = 120, cities: int = 40) -> World:
    """An encyclopedia of `companies` companies, as many founders, and `cities` cities."""
    rng = random.Random(seed)
    taken: set[str] = set()
    city_names = [_fresh_word(rng, taken, rng.choice(_CITY_ENDINGS)) for _ in range(cities)]
    world_companies = []
    for _ in range(companies):
        founder = Person(
            name=f"{rng.choice(_FIRST_NAMES)} {_fresh_word(rng, taken)}",
            birth_city=rng.choice(city_names),
            profession=rng.choice(_PROFESSIONS),
        )
        world_companies.append(
            Company(
                name=f"{_fresh_word(rng, taken)} {rng.choice(_COMPANY_KINDS)}",
                founder=founder,
                city=rng.choice(city_names),
                product=rng.choice(_PRODUCTS),
                year=rng.randint(1850, 2015),
            )
        )
    return World(seed=seed, companies=tuple(world_companies), cities=tuple(city_names))


def passages(world: World) -> list[tuple[str, str]]:
    """The encyclopedia as (title, text) entries: one per company and one per founder.

    The sentences repeat the entry's name instead of using pronouns: a small model copies answers
    more reliably from "Brenvik Works was founded by ..." than from "It was founded by ...". A
    founder's entry does not name the company, so "where was the founder of X born?" really takes two
    searches (X, then the founder's name).
    """
    entries = []
    for company in world.companies:
        name, founder = company.name, company.founder
        entries.append(
            (
                name,
                (
                    f"{name} is a company that makes {company.product}. {name} was founded by {founder.name} "
                    f"in {company.year}. The headquarters of {name} are in {company.city}."
                ),
            )
        )
        entries.append(
            (
                founder.name,
                (
                    f"{founder.name} is a {founder.profession}. "
                    f"{founder.name} was born in {founder.birth_city}."
                ),
            )
        )
    return entries


def make_questions(company: Company) -> list[dict[str, object]]:
    """Every question the encyclopedia answers about `company` and its founder.

    `hops` is the number of lookups a question needs: one entry answers it, or the first entry names
    the founder whose own entry holds the answer.
    """
    name, founder = company.name, company.founder
    return [
        {"question": f"Who founded {name}?", "answer": founder.name, "hops": 1, "kind": "founder"},
        {
            "question": f"In which city are the headquarters of {name}?",
            "answer": company.city,
            "hops": 1,
            "kind": "headquarters",
        },
        {"question": f"What does {name} make?", "answer": company.product, "hops": 1, "kind": "product"},
        {
            "question": f"In which year was {name} founded?",
            "answer": str(company.year),
            "hops": 1,
            "kind": "year",
        },
        {
            "question": f"In which city was {founder.name} born?",
            "answer": founder.birth_city,
            "hops": 1,
            "kind": "birth_city",
        },
        {
            "question": f"In which city was the founder of {name} born?",
            "answer": founder.birth_city,
            "hops": 2,
            "kind": "founder_birth_city",
        },
    ]


def split_tasks(
    world: World, test_fraction: float = 0.25, two_hop_fraction: float = 1.0, seed: int = 0
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Train and test questions about disjoint sets of companies (and founders).

    Every one-lookup question of a split's companies is kept; `two_hop_fraction` of its companies also
    get their two-lookup question (with 1.0, one question in six needs two lookups). Every task gets
    an `id` (`<split>-<n>`) and the `subject` company it is about.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}.")
    if not 0 <= two_hop_fraction <= 1:
        raise ValueError(f"two_hop_fraction must be between 0 and 1, got {two_hop_fraction}.")
    rng = random.Random(seed)
    companies = list(world.companies)
    rng.shuffle(companies)
    test_count = max(1, round(len(companies) * test_fraction))
    return (
        _questions_for(companies[test_count:], "train", two_hop_fraction, rng),
        _questions_for(companies[:test_count], "test", two_hop_fraction, rng),
    )


def _questions_for(
    companies: list[Company], split: str, two_hop_fraction: float, rng: random.Random
) -> list[dict[str, object]]:
    with_two_hop = set(rng.sample(range(len(companies)), round(len(companies) * two_hop_fraction)))
    chosen = [
        {**question, "subject": company.name}
        for position, company in enumerate(companies)
        for question in make_questions(company)
        if question["hops"] == 1 or position in with_two_hop
    ]
    rng.shuffle(chosen)
    return [{"id": f"{split}-{index}", **question} for index, question in enumerate(chosen)]


def build_tasks(
    folder: str | Path, seed: int = 0, test_size: int | None = 64, two_hop_fraction: float = 1.0
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Generate the world of `seed`, write its search index into `folder`, return (train, test) tasks.

    Each task names the index it is about (`corpus`: the index path), so tasks stay plain data the
    agent can run anywhere the file is. `test_size` keeps the first questions of the shuffled test
    split (evaluation runs every question greedily; fewer questions keep it quick).
    """
    world = make_world(seed)
    index = build_index(Path(folder) / f"encyclopedia-{seed}.sqlite", passages(world))
    train, test = split_tasks(world, two_hop_fraction=two_hop_fraction, seed=seed)
    test = test[:test_size] if test_size is not None else test
    return [{**task, "corpus": str(index)} for task in train], [
        {**task, "corpus": str(index)} for task in test
    ]
