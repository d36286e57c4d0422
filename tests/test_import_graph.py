"""The package's shape: no import circle, and one import at most that runs up a layer
(tools/import_graph.py says what the layers are)."""

import importlib.util

from tests.conftest import REPO


def _graph_tool():
    spec = importlib.util.spec_from_file_location("import_graph", REPO / "tools" / "import_graph.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_no_circle_and_one_upward_import_at_most():
    tool = _graph_tool()
    edges = tool.graph(REPO)
    assert tool.circles(edges) == []
    ups = tool.upward(edges)
    assert len(ups) <= tool.MAX_UPWARD, ups
    assert [(m, t) for m, t, _, _ in ups] == [("elmo_jax", "elmo_jax.embedding")]


def test_the_tool_sees_function_level_imports_and_circles(tmp_path):
    tool = _graph_tool()
    pkg = tmp_path / "elmo_jax"
    (pkg / "model").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model" / "__init__.py").write_text("")
    (pkg / "config.py").write_text("def f():\n    from elmo_jax.model import lstm\n")
    (pkg / "model" / "lstm.py").write_text("from elmo_jax import config\n")
    edges = tool.graph(tmp_path)
    assert tool.circles(edges) == [["elmo_jax.config", "elmo_jax.model.lstm"]]
    assert [(m, t, lazy) for m, t, _, lazy in tool.upward(edges)] == [("elmo_jax.config", "elmo_jax.model.lstm", True)]


def test_the_hub_imports_nothing_from_the_formats():
    """The hub fetches and caches; reading, converting and checking a model's files, and
    knowing which files an ELMoForManyLangs folder needs, is the formats' job, which the
    resolver hands the hub (elmo_jax.hub.model_formats)."""
    import ast

    taken = []
    for path in sorted((REPO / "elmo_jax" / "hub").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("elmo_jax.formats"):
                taken += [(path.name, node.module, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == "elmo_jax":
                taken += [(path.name, "elmo_jax", a.name) for a in node.names if a.name == "formats"]
            elif isinstance(node, ast.Import):
                taken += [(path.name, a.name, "") for a in node.names if a.name.startswith("elmo_jax.formats")]
    assert taken == []
