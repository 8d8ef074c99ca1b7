# Writes the demo corpus: JSONL documents of simple generated English (templated sentences,
# counting, small sums), so the demo needs no download and copies no text. Deterministic for a
# given seed. Usage: awk -v docs=2000 -v seed=1 -f scripts/gen_corpus.awk > corpus.jsonl
function pick(list, n) { return list[int(rand() * n) + 1] }
function sentence(   r, a, b) {
    r = rand()
    if (r < 0.45)
        return "the " pick(adj, nadj) " " pick(noun, nnoun) " " pick(verb, nverb) " the " \
               pick(adj, nadj) " " pick(noun, nnoun) " " pick(place, nplace) "."
    if (r < 0.65) {
        a = int(rand() * 50); b = int(rand() * 50)
        return a " plus " b " is " (a + b) "."
    }
    if (r < 0.85) {
        a = int(rand() * 8) + 1
        return "count: " num[a] ", " num[a + 1] ", " num[a + 2] "."
    }
    return "a " pick(noun, nnoun) " is " pick(adj, nadj) " when it is " pick(adj, nadj) "."
}
BEGIN {
    if (docs == "") docs = 2000
    if (seed == "") seed = 1
    srand(seed)
    nadj = split("small large red blue quiet loud old young bright dark happy tired", adj, " ")
    nnoun = split("cat dog bird fish child teacher farmer river tree house robot engine", noun, " ")
    nverb = split("sees follows helps finds carries watches paints builds", verb, " ")
    nplace = split("in the garden|near the river|at the market|under the bridge|on the hill|in the city", place, "|")
    split("one two three four five six seven eight nine ten", num, " ")
    for (d = 0; d < docs; d++) {
        n = int(rand() * 6) + 3
        text = ""
        for (s = 0; s < n; s++) text = text (s ? " " : "") sentence()
        printf("{\"text\": \"%s\"}\n", text)
    }
}
