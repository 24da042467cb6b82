"""Report tables (``reports.html.table_html``, the one renderer of every report's tables): numbers
formatted, a note in red, and a column of long sentences given room to read (a narrow column
wrapped the plan report's "why not" reasons and a figure's long cells to ten lines a row)."""

import re

import pandas as pd

from pagesim.reports.html import CSS, TEXT_CELL_CHARS, table_html


def test_long_text_columns_get_room_short_ones_do_not():
    reason = "stopped at t=259 s: 3 of 134 requests already over the TTFT threshold 2 s (p99 certainly above)"
    assert len(reason) > TEXT_CELL_CHARS == 40
    df = pd.DataFrame({"search": ["vllm", "vllm"], "rate": [1.25, 1312.5], "fail_reason": ["", reason],
                       "note": ["", "-22% vs paper"]})
    page = table_html(df)
    rows = re.findall(r"<tr>(.*?)</tr>", page)
    assert rows[1] == '<td>vllm</td><td>1.25</td><td class="text"></td><td></td>'
    assert rows[2] == f'<td>vllm</td><td>1,312</td><td class="text">{reason}</td><td class="note">-22% vs paper</td>'
    assert "table.data td{white-space:nowrap} table.data td.text{text-align:left;min-width:24em;white-space:normal}" \
        in CSS
