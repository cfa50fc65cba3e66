"""bench.csvrows.write_rows: the columns are the union of the rows' keys in first-seen order, a missing value is
empty, the file is replaced, and read_rows gives the rows back as strings."""

from splitlab.bench.csvrows import read_rows, write_rows


def test_write_rows_takes_the_union_of_keys_in_first_seen_order(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("old,header\n1,2\n")
    write_rows(path, [{"b": 1, "a": 2.5}, {"a": 3, "c": "x"}, {"d": None}])
    assert path.read_text().splitlines()[0] == "b,a,c,d"
    assert read_rows(path) == [{"b": "1", "a": "2.5", "c": "", "d": ""}, {"b": "", "a": "3", "c": "x", "d": ""},
                               {"b": "", "a": "", "c": "", "d": ""}]
