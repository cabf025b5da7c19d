"""The prompts a draft head's training answers: topics crossed with task forms, arithmetic, code, translation
both ways, short factual questions, role play, questions about a made-up text, long texts that ship on the
machine with a task about them (`documents.py`), questions the model writes itself, and second turns."""

from __future__ import annotations

import random

from ...api.prompts import Message

TOPICS = (
    "the water cycle", "photosynthesis", "a healthy breakfast", "learning a new language", "the history of the bicycle",
    "how vaccines work", "saving money", "remote work", "volcanoes", "the moon landing", "sleep", "recycling",
    "electric cars", "the internet", "coffee", "chess", "gardening", "time management", "the Roman Empire",
    "black holes", "climate change", "public speaking", "dogs as pets", "machine learning", "the human heart",
    "bread baking", "friendship", "a job interview", "the ocean", "renewable energy", "music practice",
    "the printing press", "bees", "running a marathon", "writing a good email", "the solar system",
    "first aid", "a trip to Japan", "budget travel", "smartphones", "the French Revolution", "rainbows",
    "teamwork", "reading habits", "cloud computing", "earthquakes", "a birthday party", "city parks",
    "inflation", "the stock market", "democracy", "the immune system", "DNA", "gravity", "electricity",
    "the Renaissance", "ancient Egypt", "the Industrial Revolution", "social media", "video games", "yoga",
    "meditation", "a small business", "customer service", "online privacy", "passwords", "databases",
    "the Python programming language", "open source software", "artificial intelligence", "robots",
    "space exploration", "Mars", "dinosaurs", "rain forests", "deserts", "coral reefs", "honey", "tea",
    "chocolate", "pizza", "a wedding speech", "moving to a new city", "learning to drive", "cooking pasta",
    "a museum visit", "the Olympic Games", "football", "tennis", "photography", "painting", "poetry",
    "jazz", "classical music", "the piano", "volunteering", "stress at work", "a home office", "cats",
    "migrating birds", "the periodic table", "nuclear power", "solar panels", "water pollution", "plastic waste",
)
FORMS = (
    "Explain {t} in simple terms.", "Write a short paragraph about {t}.", "Give three facts about {t}.",
    "What are the main benefits of {t}?", "Write a short poem about {t}.", "List five tips related to {t}.",
    "Describe {t} to a ten-year-old.", "What are common misconceptions about {t}?",
    "Write a short story that involves {t}.", "Summarize the key ideas of {t} in two sentences.",
    "Compare {t} with something similar and explain the differences.", "Why is {t} important?",
    "Write a tweet about {t}.", "What questions do people often ask about {t}? Answer two of them.",
    "Write a blog post introduction about {t}.", "What are the pros and cons of {t}?",
    "Write a persuasive essay outline about {t}.", "How has {t} changed over the last hundred years?",
    "Write a dialogue between two friends talking about {t}.", "Give a step-by-step guide related to {t}.",
    "What would a beginner need to know about {t}?", "Write a product description inspired by {t}.",
    "Create a quiz with three questions about {t}, with answers.", "What is the history of {t}?",
    "Write a formal letter to a newspaper about {t}.", "Explain {t} as an expert would.",
    "Imagine you are a teacher. Plan a short lesson about {t}.", "What careers are related to {t}?",
)
ROLES = ("a pirate captain", "a medieval knight", "a travel guide", "a detective", "a chef", "a doctor",
         "a famous scientist", "a sports coach", "a friendly robot", "a history professor", "a tour guide in Paris")
ROLE_ASKS = ("Introduce yourself and describe a typical day.", "Give me advice about {t}.",
             "Tell me what you think about {t}.", "Answer my question: what should I know about {t}?")
LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese", "Chinese")
SENTENCES = (
    "The weather is beautiful today, so we are going to the beach.", "Could you tell me where the train station is?",
    "I have been learning to cook for three months.", "Our meeting has been moved to Thursday afternoon.",
    "The library closes at eight o'clock in the evening.", "She bought a new bicycle because her old one broke.",
    "Please remember to turn off the lights when you leave.", "The museum has a new exhibition about ancient Rome.",
    "We need more time to finish the project properly.", "My brother works as a nurse in a large hospital.",
    "The children played in the garden until it got dark.", "This restaurant serves the best soup in town.",
)
CODE_TASKS = (
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a sentence", "finds the largest number in a list", "removes duplicates from a list",
    "checks whether a word is a palindrome", "sorts a list of names alphabetically", "converts Celsius to Fahrenheit",
    "computes the factorial of a number", "merges two sorted lists", "counts how often each word occurs in a text",
    "checks whether two strings are anagrams", "returns the sum of the digits of a number", "flattens a nested list",
    "reads a CSV file and prints each row", "finds the second smallest element of a list",
    "computes the average of a list",
)
CODE_LANGUAGES = ("Python", "Python", "Python", "JavaScript", "C", "Java")
NAMES = ("Anna", "Ben", "Carlos", "Diana", "Ethan", "Fatima", "George", "Hana", "Ivan", "Julia", "Kofi", "Lena")
ITEMS = ("apples", "pencils", "books", "tickets", "cupcakes", "notebooks", "oranges", "stickers")


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 40), rng.randint(2, 25), rng.randint(2, 9)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    return rng.choice((
        f"{name} has {a} {item} and buys {b} more, then gives away {c}. "
        f"How many {item} does {name} have now? Explain step by step.",
        f"A box holds {b} {item}. How many {item} are in {c} boxes and {a} loose ones? Show your reasoning.",
        f"{name} reads {b} pages a day. How many days does it take to read a book of {a * b + c} pages?",
        f"What is {a} times {b} plus {c}? Explain your calculation.",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"If {c} workers build a wall in {b} days, how long would {c * 2} workers take? Explain.",
        f"A shirt costs ${a + 10} and is on sale for {c * 5}% off. What is the sale price?",
    ))


def _passage(rng: random.Random) -> str:
    """A short made-up text with names, dates and numbers, for extraction and questions about a text."""
    name, other = rng.sample(NAMES, 2)
    day = rng.choice(("Monday", "Tuesday", "Wednesday", "Thursday", "Friday"))
    n, price, room = rng.randint(5, 60), rng.randint(10, 300), rng.randint(100, 450)
    topic = rng.choice(TOPICS)
    return (f"Meeting notes: On {day}, {name} and {other} met in room {room} to plan a workshop about {topic}. "
            f"They expect {n} participants and a budget of ${price * 10}. {name} will prepare the slides; "
            f"{other} will book the catering, which costs ${price} per day. The next meeting is in two weeks.")


def _conversation(rng: random.Random, pairs: list, i: int, sentences: list | tuple = (),
                  subjects: dict | None = None, written: float | None = None) -> str:
    """One first turn: a question the model writes itself (MODEL_QUERY, filled in while answering), topics x
    task forms, arithmetic, code, translation both ways (into English from the message catalogs'
    `sentences`), a short factual question about one of `subjects`, role play, or a question about a short
    made-up text (a kind without its source falls back to topics x forms). `written`: the share the model
    writes (MODEL_QUERY_SHARE by default); the other kinds keep their proportions among the rest."""
    from ..documents import question_prompt, translation_prompt

    kind = rng.random()
    share = MODEL_QUERY_SHARE if written is None else written
    if kind < share:
        return MODEL_QUERY  # the model writes this one itself while answering (answers.self_distill)
    if share != MODEL_QUERY_SHARE:  # the rest onto the default's range of kinds, their thresholds below
        kind = MODEL_QUERY_SHARE + (kind - share) / (1 - share) * (1 - MODEL_QUERY_SHARE)
    if kind < 0.45:
        topic, form = pairs[i % len(pairs)]
        return form.format(t=topic)
    if kind < 0.53:
        return _math(rng)
    if kind < 0.61:
        return f"Write a {rng.choice(CODE_LANGUAGES)} function that {rng.choice(CODE_TASKS)}. Explain how it works."
    if kind < 0.65:
        return f"Translate into {rng.choice(LANGUAGES)}: \"{rng.choice(SENTENCES)}\""
    if kind < 0.82:
        if kind < 0.73:
            made = translation_prompt(*sentences[i % len(sentences)], rng) if sentences else None
        else:
            made = question_prompt(subjects or {}, rng)
        if made is not None:
            return made
        topic, form = pairs[i % len(pairs)]  # a kind whose source this machine lacks
        return form.format(t=topic)
    if kind < 0.9:
        return f"Imagine you are {rng.choice(ROLES)}. {rng.choice(ROLE_ASKS).format(t=rng.choice(TOPICS))}"
    ask = rng.choice(("Who attends the meeting and what does each person do?", "Summarize this text in one sentence.",
                      "Extract every number in this text and say what it means.",
                      "What is the total cost of catering for three days?",
                      "Write a short email to the participants based on these notes."))
    return f"{_passage(rng)}\n\n{ask}"


FOLLOW_UPS = (
    "Can you make it shorter?", "Give an example.", "Explain that in more detail.", "Now say it more formally.",
    "Summarize your answer in one sentence.", "Translate the first two sentences of your answer into French.",
    "Rewrite your answer as a numbered list.", "What is the most important point? Quote it.",
    "Why is that?", "Can you give me another one?", "Rewrite it for a child.", "What are the next steps?",
)


# of first turns, how many paste a long text (documents.py) to summarise, answer from or extract from
DOCUMENT_SHARE = 0.3

# Of the other first turns, how many the model writes itself: its chat template opened at a user's turn, it
# goes on as the user (as Magpie makes instructions), so the questions are as varied as what the model has
# seen people ask, not the generator's templates. MODEL_QUERY stands in for one until it is written.
MODEL_QUERY_SHARE = 0.25
MODEL_QUERY = "\x00a question the model writes\x00"
QUERY_TOKENS = 96  # longest question; one cut there is dropped
QUERY_SAMPLING = {"temperature": 1.0, "top_p": 0.95}
QUERY_SEEDS = 1 << 40  # the questions' seeds, apart from the answers'


def prompt_conversations(n: int, seed: int = 0, documents: tuple | list | None = None,
                         sentences: list | tuple | None = None,
                         subjects: dict | None = None, written: float | None = None) -> list[tuple[Message, ...]]:
    """n conversations of one user message: questions the model writes itself (MODEL_QUERY until they are
    written while answering), topics x task forms, arithmetic word problems, code, translation both ways,
    short factual questions, role play, questions about a short made-up text, and (DOCUMENT_SHARE of them) a
    long text that ships on this machine with a task about it (second turns are added while generating).
    `documents`, `sentences`, `subjects`: the texts to paste, the sentences to translate into English and the
    names to ask about (default: what documents.py finds on this machine). `written`: the share of the
    first turns without a long text that the model writes itself (default MODEL_QUERY_SHARE)."""
    from ..documents import catalog_sentences, document_prompt, question_subjects, shipped_documents

    rng = random.Random(seed)
    pairs = [(t, f) for t in TOPICS for f in FORMS]
    rng.shuffle(pairs)
    docs = shipped_documents(seed) if documents is None else documents
    sentences = catalog_sentences(seed=seed) if sentences is None else sentences
    subjects = question_subjects() if subjects is None else subjects
    out = []
    for i in range(n):
        if docs and rng.random() < DOCUMENT_SHARE:
            out.append((Message("user", document_prompt(docs[i % len(docs)], rng)),))
        else:
            out.append((Message("user", _conversation(rng, pairs, i, sentences, subjects, written)),))
    return out


def query_prefix(tokenizer) -> list[int] | None:
    """The token ids of a conversation opened at the user's turn, as the model's chat template lays it out
    (its default system prompt included): what the model continues as the user. None without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    mark = "\x01QUESTION\x01"
    text = tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False)
    if mark not in text:
        return None
    return list(tokenizer.encode(text[: text.index(mark)], add_special_tokens=False))


def usable_query(text: str, ended: bool, asked: set[str]) -> bool:
    """Whether a question the model wrote is kept: finished (not cut at QUERY_TOKENS), 3 to 120 words, in
    plain text (nearly all printable ASCII: the runs that drift into other scripts or symbols are noise), and
    not asked before in this run."""
    words = text.split()
    if not ended or not 3 <= len(words) <= 120 or text in asked:
        return False
    plain = sum(1 for ch in text if 32 <= ord(ch) < 127 or ch in "\n\t")
    return plain >= 0.97 * len(text)
