// text/jinja_scopes.cpp — which names a frame (the template, a loop body, a macro body) starts
// with as undefined, as jinja2's compiler decides (its idtracking): a frame's statements are read
// in order, not descending into loops and macros (frames of their own, read after their parent);
// a name first loaded resolves from outside (the context, an enclosing frame), a name first
// stored is the frame's own variable and is undefined until the store runs — even where the
// context has it. So a loop before `{% set n = ... %}` at the top level reads `n` as undefined,
// not the context's `n`. A store inside an `if` resolves from outside until it runs; a store of a
// name an enclosing frame declares shares that frame's value.
//
// The result goes to Node::missing (the template's Block, each For and Macro); the evaluator binds
// those names to undefined when the frame starts (each iteration, each call).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "text/jinja.h"

namespace mhsa::jinja {
namespace {

enum class Decl { resolve, undefined, alias };

struct Frame {
  const Frame* parent = nullptr;
  std::map<std::string, Decl> refs;
  std::set<std::string> stores;
  bool declares(const std::string& name) const {
    for (const Frame* f = this; f; f = f->parent)
      if (f->refs.count(name)) return true;
    return false;
  }
};

class Analysis {
 public:
  explicit Analysis(Frame& f) : f_(f) {}
  std::vector<Node*> children;  // For and Macro nodes: frames of their own

  void load(const std::string& name) {
    if (!f_.declares(name)) f_.refs[name] = Decl::resolve;
  }
  void store(const std::string& name) {
    f_.stores.insert(name);
    if (f_.refs.count(name)) return;
    f_.refs[name] = f_.parent && f_.parent->declares(name) ? Decl::alias : Decl::undefined;
  }

  void expr(const Node* n) {
    if (!n) return;
    if (n->kind == N::Name) load(n->str);
    for (const auto& k : n->kids) expr(k.get());
  }

  void stmt(Node& n) {
    switch (n.kind) {
      case N::Output: expr(n.kids[0].get()); break;
      case N::Block:
        for (auto& k : n.kids) stmt(*k);
        break;
      case N::If: if_pair(n, 0, true); break;
      case N::For:
        expr(n.kids[0].get());  // the iterable is read outside the loop
        children.push_back(&n);
        break;
      case N::Set:
        expr(n.kids[0].get());
        if (!n.str.empty()) {
          load(n.names[0]);  // set ns.attr reads ns
        } else {
          for (const auto& name : n.names) store(name);
        }
        break;
      case N::SetBlock:
        stmt(*n.kids[0]);
        store(n.names[0]);
        break;
      case N::Macro:
        store(n.str);
        children.push_back(&n);
        break;
      default: break;
    }
  }

 private:
  // If [cond, body, cond, body, ..., else?], as jinja2 holds it: If(test, body, elif = [If(test,
  // body)...], else). Three branches, each read on a copy of the frame (the elifs, one after the
  // other, in one); a name newly stored in any branch resolves from outside until it is stored.
  void if_pair(Node& n, size_t k, bool top) {
    expr(n.kids[k].get());
    std::vector<Frame> branches;
    const auto branch = [&](auto&& visit) {
      Frame copy = f_;
      Analysis a(copy);
      visit(a);
      children.insert(children.end(), a.children.begin(), a.children.end());
      branches.push_back(std::move(copy));
    };
    branch([&](Analysis& a) { a.stmt(*n.kids[k + 1]); });
    branch([&](Analysis& a) {
      for (size_t j = k + 2; top && j + 1 < n.kids.size(); j += 2) a.if_pair(n, j, false);
    });
    branch([&](Analysis& a) {
      if (top && n.kids.size() % 2 == 1) a.stmt(*n.kids.back());
    });
    std::set<std::string> new_stores;
    for (const Frame& b : branches)
      for (const auto& name : b.stores)
        if (!f_.stores.count(name)) new_stores.insert(name);
    for (const Frame& b : branches) {
      for (const auto& [name, decl] : b.refs) f_.refs[name] = decl;
      f_.stores.insert(b.stores.begin(), b.stores.end());
    }
    for (const auto& name : new_stores) f_.refs[name] = Decl::resolve;  // (or an alias: not undefined)
  }

  Frame& f_;
};

void analyze(Node& body, const Frame* parent, const std::vector<std::string>& bound, Node& owner,
             const std::vector<Node*>& extra_loads) {
  Frame frame;
  frame.parent = parent;
  Analysis a(frame);
  for (const auto& name : bound) a.store(name);
  for (Node* e : extra_loads) a.expr(e);
  a.stmt(body);
  owner.missing.clear();
  for (const auto& [name, decl] : frame.refs)
    if (decl == Decl::undefined && std::find(bound.begin(), bound.end(), name) == bound.end())
      owner.missing.push_back(name);
  for (Node* child : a.children) {
    if (child->kind == N::For) {
      std::vector<std::string> names = child->names;
      names.push_back("loop");
      analyze(*child->kids[1], &frame, names, *child, {});
    } else {  // a macro: its parameters, their defaults, then the body
      std::vector<Node*> defaults;
      for (size_t k = 0; k + 1 < child->kids.size(); ++k) defaults.push_back(child->kids[k].get());
      analyze(*child->kids.back(), &frame, child->names, *child, defaults);
    }
  }
}

}  // namespace

void analyze_scopes(Node& root) { analyze(root, nullptr, {}, root, {}); }

}  // namespace mhsa::jinja
