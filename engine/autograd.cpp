#include "nanoddp/engine/autograd.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <queue>
#include <unordered_map>

#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/trace.h"
#include "nanoddp/kernels/error.h"

namespace nanoddp {

namespace {
// Creation order of nodes: among ready nodes the newest runs first (reverse of the forward).
std::atomic<std::uint64_t> next_sequence_nr{0};
// Nodes whose backward function has run in this thread's pass (see backward_nodes_run()).
thread_local std::uint64_t tls_backward_nodes_run = 0;
// The node whose backward function runs on this thread, for SavedTensor's message.
thread_local const Node* tls_running_node = nullptr;
// The TensorAccessObservers, process-wide; their number read without the lock (most
// processes have none).
std::atomic<int> g_access_observer_count{0};
std::mutex g_access_observers_mutex;
std::vector<TensorAccessObserver*> g_access_observers;
thread_local bool tls_notifying = false;  // an observer's own tensor use is not reported
}  // namespace

Node::Node(std::string name, const std::vector<Tensor>& inputs, BackwardFn backward)
    : name_(std::move(name)), sequence_nr_(next_sequence_nr++), backward_(std::move(backward)) {
  edges_.reserve(inputs.size());
  for (const Tensor& input : inputs) {
    Edge edge;
    if (input.defined()) {
      edge.shape = input.shape();
      edge.device = input.device();
      if (input.requires_grad()) {
        if (input.is_leaf()) {
          edge.leaf = input.impl_ptr();
        } else {
          edge.node = input.grad_fn();
        }
      }
    }
    edges_.push_back(std::move(edge));
  }
}

// A graph is a chain of nodes, each owning the next through its edges; released one destructor
// inside another, a long one overflows the stack: a running total kept as a tensor across
// 200,000 steps without a backward (`total = add(total, loss)`, PyTorch's classic `total_loss +=
// loss`) crashed when it went out of scope. So the nodes this one alone owns are taken off
// their edges and released here, one after another, each with nothing left to release deeply.
Node::~Node() {
  std::vector<std::shared_ptr<Node>> orphans;
  const auto take_orphans = [&orphans](std::vector<Edge>& edges) {
    for (Edge& edge : edges) {
      if (edge.node && edge.node.use_count() == 1) orphans.push_back(std::move(edge.node));
    }
  };
  take_orphans(edges_);
  while (!orphans.empty()) {
    std::shared_ptr<Node> node = std::move(orphans.back());
    orphans.pop_back();
    take_orphans(node->edges_);
  }  // `node` dies here, its own orphans already taken
}

Tensor SavedTensor::unpack() const {
  if (tensor_.defined() && tensor_.version() != version_) {
    fail(
        "backward through '{}': a tensor it saved for backward ({}shape {}) was written in place "
        "after the forward used it (its version is {}, it was {} when saved), so its gradient "
        "would be computed from values the forward did not see. Write into it after backward, "
        "or give the op a copy (op(x.clone())) when it must change before (PyTorch: 'one of the "
        "variables needed for gradient computation has been modified by an inplace operation')",
        tls_running_node != nullptr ? tls_running_node->name() : std::string("an op"),
        name_.empty() ? std::string() : "'" + name_ + "', ", shape_str(tensor_.shape()),
        tensor_.version(), version_);
  }
  return tensor_;
}

Tensor record(std::string name, Tensor output, const std::vector<Tensor>& inputs,
              Node::BackwardFn backward) {
  for (const Tensor& input : inputs) notify_tensor_access(input, /*before=*/false);
  if (!NoGrad::grad_enabled()) return output;
  bool any_requires_grad = false;
  for (const Tensor& input : inputs) {
    any_requires_grad = any_requires_grad || (input.defined() && input.requires_grad());
  }
  if (!any_requires_grad) return output;
  output.set_grad_fn(std::make_shared<Node>(std::move(name), inputs, std::move(backward)));
  return output;
}

std::unordered_set<const TensorImpl*> reachable_leaves(std::span<const Tensor> roots) {
  std::unordered_set<const TensorImpl*> leaves;
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> stack;
  for (const Tensor& root : roots) {
    if (!root.defined() || !root.requires_grad()) continue;
    if (root.is_leaf()) {
      leaves.insert(root.impl());
    } else if (seen.insert(root.grad_fn().get()).second) {
      stack.push_back(root.grad_fn().get());
    }
  }
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    for (const Node::Edge& edge : node->edges_) {
      if (edge.leaf) leaves.insert(edge.leaf.get());
      if (edge.node && seen.insert(edge.node.get()).second) stack.push_back(edge.node.get());
    }
  }
  return leaves;
}

std::unordered_set<const TensorImpl*> reachable_leaves(const Tensor& root) {
  return reachable_leaves(std::span<const Tensor>(&root, 1));
}

void add_tensor_access_observer(TensorAccessObserver* observer) {
  const std::lock_guard lock(g_access_observers_mutex);
  g_access_observers.push_back(observer);
  g_access_observer_count.store(static_cast<int>(g_access_observers.size()));
}

void remove_tensor_access_observer(TensorAccessObserver* observer) {
  const std::lock_guard lock(g_access_observers_mutex);
  std::erase(g_access_observers, observer);
  g_access_observer_count.store(static_cast<int>(g_access_observers.size()));
}

void notify_tensor_access(const Tensor& t, bool before) {
  if (g_access_observer_count.load(std::memory_order_relaxed) == 0 || !t.defined() ||
      tls_notifying) {
    return;
  }
  // Held while the observers run, so that none is removed (destroyed) under another thread.
  const std::lock_guard lock(g_access_observers_mutex);
  tls_notifying = true;
  try {
    for (TensorAccessObserver* o : g_access_observers) o->accessed(*t.impl(), before);
  } catch (...) {
    tls_notifying = false;
    throw;
  }
  tls_notifying = false;
}

// One execution of backward(): the bookkeeping lives only as long as the pass.
class BackwardPass final : public GradSink {
 public:
  void run(const Tensor& root);

  bool needs_grad(std::size_t i) const override { return current_->edges_.at(i).needs_grad(); }
  void emit(std::size_t i, const Tensor& grad) override;
  void accumulate(std::size_t i, const Accumulator& write) override;

 private:
  // The gradient being summed for a node's output. `owned` says whether the buffer belongs to
  // this pass: a gradient emitted by another node may be shared (add() passes its incoming
  // gradient to both inputs), so it is copied before anything is added to it in place.
  struct NodeState {
    int pending = 0;
    Tensor grad;
    bool owned = false;
  };
  struct LeafState {
    int pending = 0;
    bool received = false;
  };
  struct NewestFirst {
    bool operator()(const Node* a, const Node* b) const {
      return a->sequence_nr() < b->sequence_nr();
    }
  };

  void discover(Node* root);
  void finish_leaf(const std::shared_ptr<TensorImpl>& leaf);
  const Node::Edge& checked_edge(std::size_t i, const Tensor* grad) const;
  // A leaf's gradient buffer from its grad source (Tensor::set_grad_source), checked.
  static Tensor leaf_buffer(const Node::Edge& edge);

  std::unordered_map<Node*, NodeState> nodes_;
  std::unordered_map<TensorImpl*, LeafState> leaves_;
  Node* current_ = nullptr;
};

void BackwardPass::discover(Node* root) {
  std::vector<Node*> stack{root};
  nodes_[root];
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Node::Edge& edge : node->edges_) {
      if (edge.node) {
        auto [it, inserted] = nodes_.try_emplace(edge.node.get());
        ++it->second.pending;
        if (inserted) stack.push_back(edge.node.get());
      } else if (edge.leaf) {
        ++leaves_[edge.leaf.get()].pending;
      }
    }
  }
}

void BackwardPass::run(const Tensor& root) {
  NANODDP_CHECK(root.defined(), "backward() on an undefined tensor");
  if (root.numel() != 1) {
    fail("backward() needs a one-element tensor (a loss); got shape {}", shape_str(root.shape()));
  }
  if (!root.requires_grad()) {
    fail(
        "backward(): the tensor does not require a gradient (no parameter that requires one "
        "was used to compute it, or it was computed under NoGrad)");
  }
  const Tensor seed = Tensor::ones(root.shape(), root.device());
  if (root.is_leaf()) {
    Node self("backward-root", {root}, nullptr);
    current_ = &self;
    leaves_[root.impl()].pending = 1;
    emit(0, seed);
    finish_leaf(root.impl_ptr());
    return;
  }

  // Keep every node alive for the whole pass: a node's backward function releases the tensors
  // it captured, which may be the last references to upstream nodes.
  std::vector<std::shared_ptr<Node>> keep_alive;
  Node* root_node = root.grad_fn().get();
  discover(root_node);
  nodes_[root_node].grad = seed;
  nodes_[root_node].owned = true;

  std::priority_queue<Node*, std::vector<Node*>, NewestFirst> ready;
  ready.push(root_node);
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    NodeState& state = nodes_[node];
    if (state.grad.defined()) {
      if (!node->backward_) {
        fail(
            "backward through '{}' a second time: its saved tensors were released after the "
            "first backward. Run the forward pass again.",
            node->name());
      }
      current_ = node;
      {
        // On a GPU: when the device ran this node's kernels, not when the host enqueued them.
        Tracer* tracer = active_tracer();
        std::optional<TraceSpan> span;
        if (tracer) {
          span.emplace(
              tracer, "backward " + node->name(), TraceTrack::kCompute, root.device(),
              std::map<std::string, std::string>{{"node", std::to_string(node->sequence_nr())}});
        }
        tls_running_node = node;
        struct Reset {
          ~Reset() { tls_running_node = nullptr; }
        } reset;
        node->backward_(state.grad, *this);
      }
      ++tls_backward_nodes_run;
      current_ = nullptr;
      // Free what the backward function captured (activations) as soon as it has run.
      node->backward_ = nullptr;
    }
    state.grad = Tensor();
    for (const Node::Edge& edge : node->edges_) {
      if (edge.node) {
        keep_alive.push_back(edge.node);
        if (--nodes_[edge.node.get()].pending == 0) ready.push(edge.node.get());
      } else if (edge.leaf) {
        if (--leaves_[edge.leaf.get()].pending == 0) finish_leaf(edge.leaf);
      }
    }
  }
}

void BackwardPass::finish_leaf(const std::shared_ptr<TensorImpl>& leaf) {
  if (!leaves_[leaf.get()].received) return;
  Tensor param(leaf);
  // In a timeline: this parameter's gradient is final here (its bucket's "ready" comes from
  // the hook below, when it was the bucket's last).
  if (Tracer* tracer = active_tracer()) {
    const std::string& name = leaf->autograd.name;
    tracer->instant_on(param.device(), Tracer::Clock::now(),
                       name.empty() ? std::string("grad") : "grad " + name, TraceTrack::kMarkers,
                       {{"numel", std::to_string(param.numel())}});
  }
  // While they run, the hooks cannot be removed (HookHandle::remove refuses).
  AutogradMeta& meta = leaf->autograd;
  meta.running_hooks = true;
  try {
    for (auto& h : meta.post_accumulate_grad_hooks) h.hook(param);
  } catch (...) {
    meta.running_hooks = false;
    throw;
  }
  meta.running_hooks = false;
}

const Node::Edge& BackwardPass::checked_edge(std::size_t i, const Tensor* grad) const {
  NANODDP_CHECK(current_ != nullptr && i < current_->edges_.size(),
                "gradient for input {} of '{}' is out of range", i,
                current_ ? current_->name() : "?");
  const Node::Edge& edge = current_->edges_[i];
  if (grad != nullptr && grad->shape() != edge.shape) {
    fail("'{}' produced a gradient of shape {} for input {} of shape {}", current_->name(),
         shape_str(grad->shape()), i, shape_str(edge.shape));
  }
  return edge;
}

Tensor BackwardPass::leaf_buffer(const Node::Edge& edge) {
  Tensor buffer = edge.leaf->autograd.grad_source();
  if (!buffer.defined() || buffer.shape() != edge.shape || buffer.device() != edge.device) {
    fail("the grad source of '{}' gave a buffer of shape {} for a gradient of shape {}",
         edge.leaf->autograd.name, buffer.defined() ? shape_str(buffer.shape()) : "(none)",
         shape_str(edge.shape));
  }
  return buffer;
}

void BackwardPass::emit(std::size_t i, const Tensor& grad) {
  const Node::Edge& edge = checked_edge(i, &grad);
  if (!edge.needs_grad()) return;
  Backend& backend = backend_for(edge.device);
  if (edge.leaf) {
    AutogradMeta& meta = edge.leaf->autograd;
    if (!meta.grad.defined() && meta.grad_source) meta.grad = leaf_buffer(edge);
    if (meta.grad_valid) {
      backend.axpy(grad.numel(), 1.0f, grad.data(), meta.grad.data());
      meta.grad.increment_version();  // a saved handle to the gradient (a forward that read it)
    } else if (meta.grad.defined()) {
      meta.grad.copy_from(grad);  // reuse the (stale) buffer
    } else {
      meta.grad = grad.clone();
    }
    meta.grad_valid = true;
    leaves_[edge.leaf.get()].received = true;
    return;
  }
  NodeState& state = nodes_[edge.node.get()];
  if (!state.grad.defined()) {
    state.grad = grad;  // borrowed until something is added to it
    state.owned = false;
  } else if (!state.owned) {
    Tensor sum = Tensor::empty_like(grad);
    backend.add(state.grad.data(), grad.data(), 1.0f, sum.data(), sum.numel());
    state.grad = sum;
    state.owned = true;
  } else {
    backend.axpy(grad.numel(), 1.0f, grad.data(), state.grad.data());
  }
}

void BackwardPass::accumulate(std::size_t i, const Accumulator& write) {
  const Node::Edge& edge = checked_edge(i, nullptr);
  if (!edge.needs_grad()) return;
  if (edge.leaf) {
    AutogradMeta& meta = edge.leaf->autograd;
    if (!meta.grad.defined()) {
      meta.grad = meta.grad_source ? leaf_buffer(edge) : Tensor::empty(edge.shape, edge.device);
    }
    write(meta.grad, meta.grad_valid ? 1.0f : 0.0f);
    meta.grad.increment_version();  // a saved handle to the gradient (a forward that read it)
    meta.grad_valid = true;
    leaves_[edge.leaf.get()].received = true;
    return;
  }
  NodeState& state = nodes_[edge.node.get()];
  if (!state.grad.defined()) {
    state.grad = Tensor::empty(edge.shape, edge.device);
    write(state.grad, 0.0f);
  } else {
    if (!state.owned) state.grad = state.grad.clone();
    write(state.grad, 1.0f);
  }
  state.owned = true;
}

namespace {
// The callbacks of the backward pass running on this thread (null outside a pass).
struct BackwardCallback {
  std::function<void()> on_done;
  std::function<void()> on_abort;
};
thread_local std::vector<BackwardCallback>* tls_backward_callbacks = nullptr;
thread_local std::uint64_t tls_backward_pass = 0;
thread_local std::uint64_t tls_backward_passes_started = 0;

// Installs the pass's callback list for this thread, and removes it however the pass ends.
class CallbackScope {
 public:
  CallbackScope() {
    tls_backward_callbacks = &callbacks_;
    tls_backward_pass = ++tls_backward_passes_started;
    tls_backward_nodes_run = 0;
  }
  ~CallbackScope() {
    tls_backward_callbacks = nullptr;
    tls_backward_pass = 0;
  }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;
  // Callbacks may queue further callbacks; runs until none are left. A callback that throws ends
  // the pass like a failing node does: the callbacks that have not run yet get their on_abort.
  void run_all() {
    std::size_t i = 0;
    try {
      for (; i < callbacks_.size(); ++i) {
        auto callback = std::move(callbacks_[i].on_done);
        callback();
      }
    } catch (...) {
      abort_from(i + 1);
      throw;
    }
  }
  // The pass failed: give every callback's owner from `first` on its chance to clean up (never
  // throws).
  void abort_from(std::size_t first = 0) noexcept {
    for (std::size_t i = first; i < callbacks_.size(); ++i) {
      if (!callbacks_[i].on_abort) continue;
      try {
        callbacks_[i].on_abort();
      } catch (...) {
      }
    }
  }

 private:
  std::vector<BackwardCallback> callbacks_;
};

}  // namespace

void run_backward(const Tensor& root) {
  NANODDP_CHECK(tls_backward_callbacks == nullptr, "backward() called from inside a backward pass");
  CallbackScope scope;
  try {
    BackwardPass pass;
    pass.run(root);
  } catch (...) {
    scope.abort_from();
    throw;
  }
  scope.run_all();
}

std::uint64_t current_backward_pass() {
  return tls_backward_pass;
}

std::uint64_t backward_nodes_run() {
  return tls_backward_nodes_run;
}

void queue_backward_callback(std::function<void()> callback, std::function<void()> on_abort) {
  NANODDP_CHECK(tls_backward_callbacks != nullptr,
                "queue_backward_callback() outside of a backward pass");
  tls_backward_callbacks->push_back({std::move(callback), std::move(on_abort)});
}

}  // namespace nanoddp
