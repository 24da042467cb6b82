"""Text for a person fits 100 columns (``sim.terminal``): wrapped under its indent, never inside
a word or at a hyphen; a table too wide goes in blocks of columns led by its key columns, its
sentences listed beneath it beside their row's keys."""

from pagesim.sim.terminal import WIDTH, fill, table_lines


def test_fill_wraps_under_its_indent_and_keeps_flags_whole():
    text = "use a longer --duration or a smaller --rtol, or read the leave-one-model-out band " * 3
    lines = fill(text.strip(), first="pagesim: warning: ").splitlines()
    assert WIDTH == 100 and len(lines) == 3 and all(len(line) <= 100 for line in lines)
    assert lines[0].startswith("pagesim: warning: use") and all(line.startswith("  ") for line in lines[1:])
    assert "leave-one-model-out" in " ".join(lines).split() and "--duration" in " ".join(lines).split()


def test_a_table_that_fits_is_one_block_keys_left_numbers_right():
    lines = table_lines(["system", "rate", "req/s"], [["vllm", "1", "1.25"], ["orca-max", "0.5", "0.24"]])
    assert lines == ["system    rate  req/s",
                     "vllm         1   1.25",
                     "orca-max   0.5   0.24"]


def test_a_wide_table_goes_in_blocks_each_led_by_the_keys():
    header = ["search", "rate", "aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc"]
    rows = [["vllm", "1", "1", "2", "3"]]
    # width 30: keys (6 + 4 + 2 x 2 = 14) and one 10-wide column fit, a second does not (36 > 30)
    assert table_lines(header, rows, keys=2, width=30) == [
        "search  rate  aaaaaaaaaa",
        "vllm    1              1",
        "",
        "search  rate  bbbbbbbbbb",
        "vllm    1              2",
        "",
        "search  rate  cccccccccc",
        "vllm    1              3"]
    assert len(table_lines(header, rows, keys=2, width=100)) == 2  # all in one block


def test_sentences_go_under_the_table_beside_their_rows_keys():
    header = ["search", "rate", "pass", "why not"]
    rows = [["vllm", "1", "yes", "-"], ["vllm", "2", "no", "stopped at t=96 s: 25 of 1225 requests already over "
                                                          "the TTFT threshold 2 s (p99 certainly above)"]]
    lines = table_lines(header, rows, keys=2, text=(3,), width=60)
    assert lines[:3] == ["search  rate  pass", "vllm    1      yes", "vllm    2       no"]
    assert lines[3] == "why not:"
    assert lines[4] == "  vllm rate 2: stopped at t=96 s: 25 of 1225 requests"  # 61 with "already"
    assert all(line.startswith("    ") for line in lines[5:]) and all(len(line) <= 60 for line in lines)
    assert table_lines(header, rows[:1], keys=2, text=(3,)) == ["search  rate  pass", "vllm    1      yes"]
    assert table_lines(header, [], keys=2, text=(3,)) == ["search  rate  pass"]  # no rows: the header


def test_key_value_lines_align_values_and_wrap_a_long_one_under_itself():
    from pagesim.sim.terminal import key_value_lines

    rows = [("system", "vllm"), ("cost model", "roofline (GPU time per iteration vs measured on a100-80gb: "
                                              "median 12.0 %, p90 36.7 %, all measured models)")]
    lines = key_value_lines(rows, width=60)
    assert lines[0] == "system      vllm"
    assert lines[1].startswith("cost model  roofline") and all(line.startswith(" " * 12) for line in lines[2:])
    assert len(lines) == 4 and max(map(len, lines)) <= 60
