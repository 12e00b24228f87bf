"""MkDocs hook: the search index as a script, so that search works when the site is opened from disk.

A browser that opens site/index.html from disk (file://) refuses the built-in search's web worker
and its request for search/search_index.json. After the search plugin writes that file, this hook
writes the same index as search/search_index.js, which js/offline-search.js loads with a <script>
tag (allowed from disk) to search on the page itself. Served over HTTP, the built-in search runs
as it always does and this file is not read.
"""

from pathlib import Path


def on_post_build(config, **kwargs):
    search = Path(config["site_dir"]) / "search"
    index = search / "search_index.json"
    if index.exists():
        script = "window.agenttasksSearchIndex = " + index.read_text(encoding="utf-8") + ";\n"
        (search / "search_index.js").write_text(script, encoding="utf-8")
