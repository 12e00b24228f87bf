"""MkDocs hook: a line `<!-- include: PATH -->` in a page is replaced by the file PATH of the
repository, read at every build, so the page cannot drift from it (docs/changelog.md shows
CHANGELOG.md). No markdown extension is needed: the site builds with MkDocs alone.

The included file's links are written from where it lies in the repository: a link into docs/
becomes a link between pages of this site (so `mkdocs build --strict` checks it), any other
relative link a link to the file on GitHub (`repo_url`), and absolute links stay as they are.
"""

import posixpath
import re
from pathlib import Path

INCLUDE = re.compile(r"^<!-- include: (\S+) -->$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")
ABSOLUTE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|/|#)")
BRANCH = "blob/main/"  # where repo_url shows a file, as the README's links do


def on_page_markdown(markdown, page, config, **kwargs):
    root = Path(config["config_file_path"]).resolve().parent
    docs = Path(config["docs_dir"]).resolve().relative_to(root).as_posix()
    here = posixpath.dirname(page.file.src_uri)

    def target(source: str, link: str) -> str:
        if ABSOLUTE.match(link):
            return link
        path, hash_, fragment = link.partition("#")
        path = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        if path.startswith(docs + "/"):
            path = posixpath.relpath(path[len(docs) + 1 :], here or ".")
        else:
            path = config["repo_url"].rstrip("/") + "/" + BRANCH + path
        return path + hash_ + fragment

    def include(match: re.Match) -> str:
        source = match.group(1)
        text = (root / source).read_text(encoding="utf-8")
        # "Edit on GitHub" opens the included file, where the text is written.
        page.edit_url = config["repo_url"].rstrip("/") + "/" + BRANCH + source
        return LINK.sub(lambda link: "](" + target(source, link.group(1)) + ")", text)

    return INCLUDE.sub(include, markdown)
