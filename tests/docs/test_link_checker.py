#!/usr/bin/env python3
"""The link checker itself: on a small made-up tree it must refuse a link whose text is prose,
a link that lands on a declaration of its name, a link to a line without its code, and a bare
function name on a caller's line when the file defines the function; and it must accept a link to
a call, a qualified or bare link to a definition, and code text holding brackets. A qualified
name (`AdamW::update_slice`) must be spelt whole on its line or declared inside its class: its bare
last part elsewhere (`SGD::update_slice`, a comment, a call) is refused."""
import pathlib
import subprocess
import sys
import tempfile

checker = pathlib.Path(__file__).with_name("check_source_links.py")
source = """\
void Reducer::launch(std::size_t bucket, float divide_by) {
  group_->allreduce(bucket, divide_by);
}
int pending_ = 0;
void issue(const std::function<void(int)>& launch,
           bool blocking) { launch(3); }
void run() {
  for (int i = 0; i < 4; ++i) acc[i] /= divisor;
  worker->enqueue(7);
}
class Optimizer {
 public:
  // Sharded: from now on update only the shard.
  void shard(int shard);
  virtual void update_slice(int offset) = 0;
};
void SGD::update_slice(int offset) { opt.shard(offset); }
void AdamW::update_slice(int offset) {}
"""
cases = {
    "[`Reducer::launch`](../src/r.cpp#L1)": True,   # qualified: the definition
    "[`allreduce`](../src/r.cpp#L2)": True,         # a call
    "[`divide_by`](../src/r.cpp#L2)": True,         # used as an argument
    "[`divide_by`](../src/r.cpp#L1)": False,        # only its parameter declaration
    "[`pending_`](../src/r.cpp#L4)": False,         # a member declaration
    "[launches the bucket](../src/r.cpp#L2)": False,  # prose with a line number
    "[`launch`](../src/r.cpp#L3)": False,           # the line does not contain it
    "[`launch(...)`](../src/r.cpp#L5)": False,      # a parameter of a template type with ()
    "[`launch(...)`](../src/r.cpp#L6)": True,       # its call
    "[`acc[i] /= divisor`](../src/r.cpp#L8)": True,  # brackets in the code text
    "[`acc[i] /= divisor`](../src/r.cpp#L7)": False,  # ... which is still checked
    "[`launch`](../src/r.cpp#L1)": True,             # a bare name: the function's definition
    "[`launch`](../src/r.cpp#L6)": False,            # not a call, when the file defines it
    "[`enqueue`](../src/r.cpp#L9)": True,            # defined elsewhere: a call will do
    # A qualified name: spelt whole, or declared inside its class; its bare last part on some
    # other line (a comment, another class's definition, a call) does not do.
    "[`Optimizer::shard`](../src/r.cpp#L14)": True,   # declared in class Optimizer
    "[`Optimizer::shard`](../src/r.cpp#L13)": False,  # a comment that says "shard"
    "[`Optimizer::shard`](../src/r.cpp#L17)": False,  # a call `opt.shard(`
    "[`Optimizer::update_slice`](../src/r.cpp#L15)": True,  # a virtual declaration
    "[`AdamW::update_slice`](../src/r.cpp#L18)": True,   # its definition
    "[`AdamW::update_slice`](../src/r.cpp#L17)": False,  # SGD's definition
    "[`SGD::update_slice`](../src/r.cpp#L15)": False,    # declared in another class
}
failures = 0
for link, ok in cases.items():
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        (root / "src").mkdir()
        (root / "docs").mkdir()
        (root / "src" / "r.cpp").write_text(source)
        (root / "docs" / "x.md").write_text(f"See {link}.\n")
        (root / "README.md").write_text("nothing\n")
        run = subprocess.run([sys.executable, str(checker), str(root)], capture_output=True,
                             text=True)
        accepted = run.returncode == 0
        if accepted != ok:
            failures += 1
            print(f"FAIL: {link}: expected {'accepted' if ok else 'refused'}, got "
                  f"{'accepted' if accepted else 'refused'}: {run.stdout.strip()}")
        else:
            print(f"ok: {link} {'accepted' if ok else 'refused'}")
sys.exit(1 if failures else 0)
