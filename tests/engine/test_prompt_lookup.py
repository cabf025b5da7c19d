import torch

from specula.engine.drafters.prompt_lookup import find_continuation


def t(*ids):
    return torch.tensor(ids)


def test_longest_match_wins():
    # suffix (7, 8, 9) occurs once; the 1-gram 9 also occurs later with another continuation
    tokens = t(7, 8, 9, 1, 2, 3, 9, 5, 7, 8, 9)
    assert find_continuation(tokens, 3, 1, 3).tolist() == [1, 2, 3]


def test_most_recent_match_among_equals():
    tokens = t(4, 1, 4, 2, 4)
    assert find_continuation(tokens, 1, 1, 1).tolist() == [2]


def test_min_n_is_respected_and_no_match_is_empty():
    tokens = t(1, 2, 3, 4, 5, 3)
    assert find_continuation(tokens, 2, 1, 2).tolist() == [4, 5]
    assert find_continuation(tokens, 2, 2, 2).numel() == 0
    assert find_continuation(t(1), 2, 1, 3).numel() == 0


def test_continuation_is_capped_at_k_and_at_the_end():
    tokens = t(1, 2, 3, 4, 5, 6, 1, 2)
    assert find_continuation(tokens, 3, 1, 2).tolist() == [3, 4, 5]
    assert find_continuation(t(5, 6, 5), 4, 1, 1).tolist() == [6, 5]


def test_draft_length_follows_the_match_length():
    # last token 9 matched alone: two tokens; last three tokens matched: up to six, capped by k
    one = t(9, 1, 2, 3, 4, 5, 6, 9)
    assert find_continuation(one, 8, 1, 16).tolist() == [1, 2]
    three = t(7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert find_continuation(three, 8, 1, 16).tolist() == [1, 2, 3, 4, 5, 6]
    assert find_continuation(three, 4, 1, 16).tolist() == [1, 2, 3, 4]
    assert find_continuation(three, 8, 1, 2).tolist() == [1, 2, 3, 4]  # match length capped at max_n


def test_match_search_agrees_with_brute_force():
    from specula.engine.drafters.prompt_lookup import longest_match

    gen = torch.Generator().manual_seed(0)
    for trial in range(600):
        tokens = torch.randint(0, 2 + trial % 5, (1 + trial % 40,), generator=gen)
        if trial % 3 == 0:  # a copy of an earlier stretch at the end: long matches (searched all at once)
            tokens = torch.cat((tokens, tokens[: trial % 23]))
        ids = tokens.tolist()
        for max_n in (1, 2, 3, 4, 6, 16):
            best_n, best_start = 0, 0
            for end in range(len(ids) - 1):  # earlier occurrence ending at `end`
                n = 0
                while n < max_n and end - n >= 0 and ids[end - n] == ids[len(ids) - 1 - n]:
                    n += 1
                if n >= best_n and n > 0:
                    best_n, best_start = n, end + 1
            assert longest_match(tokens.numpy(), max_n) == (best_n, best_start), (ids, max_n)
