// Search for a site opened from disk (file://), where the browser refuses the built-in search's
// web worker and its request for search_index.json: the index comes as a script
// (search/search_index.js, written by docs_theme/offline_search.py) and lunr runs on the page.
// The results are shown by the built-in search's own displayResults (search/main.js).
(function () {
  if (window.location.protocol !== "file:") {
    return; // served over HTTP: the built-in search works as it is
  }

  function load(path, done) {
    var script = document.createElement("script");
    script.src = joinUrl(base_url, path);
    script.onload = done;
    document.head.appendChild(script);
  }

  function start() {
    var input = document.getElementById("mkdocs-search-query");
    if (!input) {
      return;
    }
    load("search/lunr.js", function () {
      load("search/search_index.js", function () {
        var data = window.agenttasksSearchIndex;
        var shortest = (data.config && data.config.min_search_length) || 3;
        var documents = {};
        var index = lunr(function () {
          this.field("title");
          this.field("text");
          this.ref("location");
          data.docs.forEach(function (doc) {
            this.add(doc);
            documents[doc.location] = doc;
          }, this);
        });

        function search() {
          var query = input.value;
          if (query.length < shortest) {
            displayResults([]);
            return;
          }
          var found = [];
          try {
            found = index.search(query);
          } catch (error) {
            found = []; // a query lunr cannot parse (a lone "+" or ":") finds nothing
          }
          displayResults(
            found.map(function (result) {
              var doc = documents[result.ref];
              return { location: doc.location, title: doc.title, summary: doc.text.substring(0, 200) };
            })
          );
        }

        input.addEventListener("keyup", search);
        var term = new URLSearchParams(window.location.search).get("q");
        if (term) {
          input.value = term;
        }
        if (input.value) {
          search();
        }
      });
    });
  }

  document.addEventListener("DOMContentLoaded", start);
})();
