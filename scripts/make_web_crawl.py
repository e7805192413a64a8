"""Write the demo web crawl, `data/web/crawl-*.warc.gz`: WARC files of HTML pages made from text
the repository already holds (the demo corpus's prose, the demo tasks), so that nothing is
downloaded. Deterministic: the same bytes every time (`python scripts/make_web_crawl.py`).

A crawl is never clean, and each kind of page is here for a stage of `experiments/web_to_tokens.py`
to find:

    article        English prose in a page with a menu, a sidebar, a footer, scripts and
                   styles (what extraction strips); some in windows-1252, some with mojibake
                   (what the Unicode repair fixes)
    foreign        French, German and Spanish pages (language identification)
    seo            search-engine bait: well-formed sentences that say nothing (the quality
                   classifier; `low_quality.jsonl`, made apart, is its negative examples)
    spam           keyword lists and one sentence repeated (Gopher's repetition rules)
    boilerplate    a menu, a cookie notice and "lorem ipsum" around a few words (C4's and
                   Gopher's quality rules)
    list           a long list of short lines (FineWeb's rules)
    copy           an article again under another URL, whole or with one paragraph changed
                   (dedupe)
    leaked         an article that quotes a demo task's test item (decontaminate)
    not html       an image and a PDF; an empty page (extraction counts them, never fails)

The last file's last record is cut short, as an interrupted download leaves it.
"""

from __future__ import annotations

import gzip
import html
import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "web"
FILES = 3
PAGES_PER_FILE = 150

FOREIGN = {
    "fr": [
        "Le matin, la petite ville se réveille lentement sous un ciel gris.",
        "Marie prend son vélo et descend la rue jusqu'au marché couvert.",
        "Les marchands installent leurs étals de fruits, de pain et de fromage.",
        "Elle achète des pommes, une baguette et un morceau de comté pour sa grand-mère.",
        "Sur le chemin du retour, elle s'arrête devant la bibliothèque municipale.",
        "Le bibliothécaire lui conseille un roman sur les voyages en mer.",
        "Le soir, toute la famille se retrouve autour de la table pour dîner.",
        "Ils parlent de leurs projets pour les vacances d'été à la montagne.",
    ],
    "de": [
        "Am frühen Morgen liegt noch Nebel über dem kleinen Dorf am See.",
        "Der Bäcker öffnet seinen Laden und verkauft frische Brötchen.",
        "Die Kinder gehen mit ihren Schultaschen über die alte Steinbrücke.",
        "Im Sommer schwimmen die Leute im klaren Wasser und sonnen sich am Ufer.",
        "Am Nachmittag trifft sich der Chor in der Kirche, um für das Fest zu üben.",
        "Die Großmutter erzählt Geschichten von früher, als es noch keinen Strom gab.",
        "Nach dem Abendessen spielen alle zusammen Karten in der warmen Stube.",
        "Im Herbst sammeln sie Äpfel und kochen Marmelade für den Winter.",
    ],
    "es": [
        "Por la mañana, el mercado del pueblo se llena de colores y de voces.",
        "Carmen compra tomates, pimientos y un poco de queso para la cena.",
        "Su hermano prefiere pasear por el parque con el perro de la vecina.",
        "En verano, las familias cenan tarde en las terrazas de la plaza mayor.",
        "Los niños juegan al fútbol hasta que el sol se esconde detrás de los montes.",
        "La abuela prepara una tortilla de patatas que todos esperan con ganas.",
        "Después de comer, el abuelo duerme la siesta a la sombra de un olivo.",
        "Por la noche, se oyen guitarras y canciones desde las ventanas abiertas.",
    ],
}

SEO = [
    "Looking for the best {p}? Our {a} {p} are the top choice for {u} in {y}.",
    "Buy {a} {p} online today and save up to {n} percent with our exclusive deals.",
    "Click here to discover why {u} love our {p} and order yours now.",
    "Top {n} reasons to choose our {a} {p}: quality, price, and fast delivery.",
    "Don't miss out on the hottest {p} deals of {y}, limited time only.",
    "Our experts reviewed {n} {p} so you can find the perfect one for {u}.",
    "Get the {a} {p} you deserve with free returns and a money back guarantee.",
    "Sign up for our newsletter and get {n} percent off your first order of {p}.",
    "Compare prices on {a} {p} and find the best offer for {u} near you.",
    "Shop now for {a} {p} with the lowest prices guaranteed in {y}.",
    "Thousands of happy customers have already bought our {p}, and you can too.",
    "Find out which {p} are trending right now and why {u} can't get enough of them.",
]
SEO_PRODUCTS = [
    "running shoes",
    "phone cases",
    "garden tools",
    "vitamins",
    "headphones",
    "coffee makers",
    "yoga mats",
]
SEO_ADJECTIVES = ["cheap", "premium", "affordable", "amazing", "best-selling", "top rated", "discount"]
SEO_AUDIENCES = ["busy parents", "students", "athletes", "professionals", "everyone", "beginners"]

SPAM_WORDS = [
    "cheap",
    "shoes",
    "best",
    "price",
    "buy",
    "now",
    "discount",
    "sale",
    "free",
    "shipping",
    "online",
    "store",
    "deal",
]
MENU = ["Home", "News", "Sports", "Weather", "Contact", "About us", "Login", "Sign up", "Shop", "Help"]


def main() -> None:
    rng = random.Random(20261207)
    prose = _texts(ROOT / "data" / "corpus" / "prose", "train-*.jsonl")
    leaks = [json.loads(line) for line in (ROOT / "data" / "tasks" / "stories" / "test.jsonl").open()]
    OUT.mkdir(parents=True, exist_ok=True)
    start = datetime(2026, 11, 2, 3, 0, tzinfo=UTC)
    articles: list[tuple[str, list[str]]] = []
    page = 0
    for number in range(FILES):
        records = [_warcinfo(f"crawl-{number:04d}.warc.gz", start)]
        for _ in range(PAGES_PER_FILE):
            page += 1
            when = start + timedelta(minutes=7 * page)
            kind = rng.choices(
                ["article", "foreign", "seo", "spam", "boilerplate", "list", "copy", "leaked", "odd"],
                weights=[54, 10, 8, 5, 5, 4, 8, 2, 4],
            )[0]
            if kind == "copy" and not articles:
                kind = "article"
            url = f"http://www.example{page % 17}.test/{kind}/{page}"
            records.extend(_page(rng, kind, url, when, prose, leaks, articles))
        data = b"".join(gzip.compress(r, mtime=0) for r in records)
        if number == FILES - 1:
            last = gzip.compress(records[-1], mtime=0)
            data = data[: len(data) - len(last) // 2]  # the last record cut in the middle
        (OUT / f"crawl-{number:04d}.warc.gz").write_bytes(data)
        print(f"{OUT / f'crawl-{number:04d}.warc.gz'}: {len(records) - 1} records, {len(data):,} bytes")
    # Examples of what the quality classifier should score low (its negative set), made apart
    # from the crawl: search-engine bait and keyword lists, none of them a page of the crawl.
    bait = random.Random(7)
    with (OUT / "low_quality.jsonl").open("w") as f:
        for i in range(200):
            if i % 4 == 3:
                text = " ".join(bait.choice(SPAM_WORDS) for _ in range(bait.randint(40, 120)))
            else:
                text = "\n\n".join(_seo(bait) for _ in range(bait.randint(2, 4)))
            f.write(json.dumps({"id": f"low_quality/{i:04d}", "text": text}) + "\n")
    print(f"{OUT / 'low_quality.jsonl'}: 200 documents")


def _page(
    rng: random.Random,
    kind: str,
    url: str,
    when: datetime,
    prose: list[str],
    leaks: list[dict],
    articles: list[tuple[str, list[str]]],
) -> list[bytes]:
    """The WARC records of one fetched page (a request and its response)."""
    charset = "utf-8"
    if kind == "article":
        paragraphs = rng.sample(prose, rng.randint(3, 6))
        if rng.random() < 0.15:  # text decoded with the wrong code page somewhere upstream
            paragraphs[0] = paragraphs[0].replace("'", "\u2019").encode("utf-8").decode("cp1252", "replace")
        articles.append((url, paragraphs))
        body = _article(rng, _title(paragraphs[0]), paragraphs)
        if rng.random() < 0.2:
            charset = "windows-1252"
    elif kind == "foreign":
        language = rng.choice(sorted(FOREIGN))
        paragraphs = [" ".join(rng.sample(FOREIGN[language], 4)) for _ in range(rng.randint(2, 4))]
        body = _article(rng, FOREIGN[language][0][:30], paragraphs, lang=language)
    elif kind == "spam":
        if rng.random() < 0.5:
            words = [rng.choice(SPAM_WORDS) for _ in range(rng.randint(120, 300))]
            paragraphs = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
        else:
            line = "Buy the best cheap shoes online today with free shipping."
            paragraphs = [line] * rng.randint(15, 40)
        body = _article(rng, "Best deals", paragraphs)
    elif kind == "seo":
        paragraphs = [_seo(rng) for _ in range(rng.randint(2, 4))]
        body = _article(rng, "Best " + rng.choice(SEO_PRODUCTS), paragraphs)
    elif kind == "boilerplate":
        paragraphs = [
            "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
            "This site uses cookies. Please enable javascript to view the page.",
            "Read our privacy policy and terms of use.",
            *(rng.choice(MENU) for _ in range(rng.randint(5, 12))),
        ]
        body = _article(rng, "Welcome", paragraphs)
    elif kind == "list":
        items = [rng.choice(MENU) + f" {i}" for i in range(rng.randint(40, 90))]
        body = _document("Directory", "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>")
    elif kind == "copy":
        _original, paragraphs = rng.choice(articles)
        paragraphs = list(paragraphs)
        if rng.random() < 0.5:  # a near copy: one paragraph replaced
            paragraphs[-1] = rng.choice(prose)
        body = _article(rng, _title(paragraphs[0]), paragraphs)
    elif kind == "leaked":
        item = rng.choice(leaks)
        quoted = f"{item['query']} {item['choices'][item['gold']]}"
        paragraphs = [*rng.sample(prose, 2), quoted, rng.choice(prose)]
        body = _article(rng, _title(paragraphs[0]), paragraphs)
    else:  # not a page of text
        what = rng.choice(["image", "pdf", "empty"])
        if what == "image":
            return _exchange(
                url, when, "image/png", b"\x89PNG\r\n\x1a\n" + bytes(rng.randrange(256) for _ in range(300))
            )
        if what == "pdf":
            return _exchange(url, when, "application/pdf", b"%PDF-1.4\n1 0 obj\n<<>>\nendobj\n%%EOF\n")
        return _exchange(url, when, "text/html; charset=utf-8", b"<html><head></head><body></body></html>")
    return _exchange(url, when, f"text/html; charset={charset}", body.encode(charset, "replace"))


def _seo(rng: random.Random) -> str:
    """A paragraph of search-engine bait: sentences that pass every rule about form and say nothing."""
    return " ".join(
        rng.choice(SEO).format(
            p=rng.choice(SEO_PRODUCTS),
            a=rng.choice(SEO_ADJECTIVES),
            u=rng.choice(SEO_AUDIENCES),
            n=rng.randint(3, 50),
            y=rng.choice(["2025", "2026"]),
        )
        for _ in range(rng.randint(4, 7))
    )


def _title(text: str) -> str:
    return " ".join(text.split()[:6]).rstrip(".,!?")


def _article(rng: random.Random, title: str, paragraphs: list[str], lang: str = "en") -> str:
    menu = "".join(f'<li><a href="/{m.lower().replace(" ", "-")}">{m}</a></li>' for m in rng.sample(MENU, 6))
    related = "".join(
        f'<li><a href="/story/{rng.randrange(10_000)}">Story {rng.randrange(100)}</a></li>' for _ in range(4)
    )
    main = "".join(f"<p>{html.escape(p)}</p>" for p in paragraphs)
    return _document(
        title,
        f'<header><nav><ul class="menu">{menu}</ul></nav></header>'
        f'<div class="layout"><aside class="sidebar"><h3>Related</h3><ul>{related}</ul></aside>'
        f"<main><article><h1>{html.escape(title)}</h1>{main}</article></main></div>"
        "<footer><p>Copyright 2026 Example Media. All rights reserved.</p>"
        '<p><a href="/privacy">Privacy</a> | <a href="/terms">Terms</a></p></footer>',
        lang,
    )


def _document(title: str, body: str, lang: str = "en") -> str:
    return (
        f'<!DOCTYPE html><html lang="{lang}"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        "<style>body { font-family: sans-serif; } .menu li { display: inline; }</style>"
        "<script>window.dataLayer = window.dataLayer || []; function track() { return 1; }</script>"
        f"</head><body>{body}</body></html>"
    )


def _exchange(url: str, when: datetime, content_type: str, payload: bytes) -> list[bytes]:
    date = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    request = f"GET {url.split('.test', 1)[1]} HTTP/1.1\r\nHost: {url.split('/')[2]}\r\n\r\n".encode()
    response = (
        f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return [
        _record("request", url, date, "application/http; msgtype=request", request),
        _record("response", url, date, "application/http; msgtype=response", response),
    ]


def _warcinfo(name: str, when: datetime) -> bytes:
    fields = b"software: drydock scripts/make_web_crawl.py\r\nformat: WARC File Format 1.1\r\n"
    return _record(
        "warcinfo", None, when.strftime("%Y-%m-%dT%H:%M:%SZ"), "application/warc-fields", fields, name
    )


def _record(
    kind: str, url: str | None, date: str, content_type: str, block: bytes, filename: str = ""
) -> bytes:
    identity = uuid.uuid5(uuid.NAMESPACE_URL, f"{kind}:{url or filename}:{date}")
    headers = [
        "WARC/1.1",
        f"WARC-Type: {kind}",
        f"WARC-Record-ID: <urn:uuid:{identity}>",
        f"WARC-Date: {date}",
        *([f"WARC-Target-URI: {url}"] if url else []),
        *([f"WARC-Filename: {filename}"] if filename else []),
        f"Content-Type: {content_type}",
        f"Content-Length: {len(block)}",
    ]
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + block + b"\r\n\r\n"


def _texts(directory: Path, pattern: str) -> list[str]:
    return [json.loads(line)["text"] for path in sorted(directory.glob(pattern)) for line in path.open()]


if __name__ == "__main__":
    main()
