#pragma once
// Define-by-run autograd.
//
// Every differentiable op that sees an input requiring a gradient records a Node: the inputs it
// read and a small backward function. The nodes form a DAG pointing from outputs back to
// inputs; leaves (parameters) have no node. `loss.backward()` walks that DAG:
//
//  1. Discover the nodes reachable from the loss and count, for every node and every leaf, how
//     many edges point at it (its number of pending gradient contributions).
//  2. Run nodes in dependency order. A node runs once all its consumers have contributed, and
//     among the ready nodes the most recently created runs first (like PyTorch), so the last
//     layer's backward runs first.
//  3. A node's backward function gets the gradient of its output and a GradSink through which
//     it hands each input its gradient. For leaves the sink accumulates straight into the
//     leaf's `.grad` buffer: a linear layer's weight gradient is written by the GEMM itself
//     (beta = 1), never into a temporary that is then added.
//  4. When a leaf's last contribution is in, its post-accumulate-grad hooks run at once, in
//     the middle of the backward pass. The DDP Reducer hangs off exactly that moment: the
//     gradient is final, so its bucket can be counted down and, when complete, reduced while
//     the backward pass continues with earlier layers.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "nanoddp/engine/tensor.h"

namespace nanoddp {

// How a backward function delivers the gradient of each of its inputs.
class GradSink {
 public:
  // Writes `result` into `dst` as dst = beta * dst + result; beta is 0 or 1.
  using Accumulator = std::function<void(Tensor& dst, float beta)>;

  virtual ~GradSink() = default;
  // Whether input `i` wants a gradient at all (skip the work when not).
  virtual bool needs_grad(std::size_t i) const = 0;
  // Hands input `i` an already computed gradient.
  virtual void emit(std::size_t i, const Tensor& grad) = 0;
  // Lets the caller write input `i`'s gradient in place (e.g. a GEMM with beta), avoiding a
  // temporary. `write` is called exactly once, with the destination and the beta to use.
  virtual void accumulate(std::size_t i, const Accumulator& write) = 0;
};

class Node;
// The leaves (parameters) `root`'s graph reaches: those a backward from `root` can give a
// gradient. The DDP Reducer walks its forward's output with it to find, before backward
// starts, the parameters that will get none (find_unused_parameters). Several roots: the leaves
// any of them reaches (a model with several outputs).
std::unordered_set<const TensorImpl*> reachable_leaves(std::span<const Tensor> roots);
std::unordered_set<const TensorImpl*> reachable_leaves(const Tensor& root);

// Who is told when a tensor's memory is used. Every op of the library tells it of each float
// input before reading it (in its input check), and record() again after the op ran (also
// under NoGrad, where it records nothing: the only word from an op written elsewhere); the host
// reads and copies (to_vector(), item(), clone(), to(), copy_from() on both ends, fill(), zero())
// and Optimizer::step() tell it before they touch the memory. Told before, an observer may still
// wait for the memory. ZeRO's all-gather overlap
// (comm/zero_overlap.h) watches the flat parameter buffer with it: no op may read a parameter
// whose all-gather is still in flight. Process-wide, any thread; raw pointers (data(),
// raw_data()) are not seen.
class TensorAccessObserver {
 public:
  virtual ~TensorAccessObserver() = default;
  // `before`: the memory is about to be used; else an op has used it.
  virtual void accessed(const TensorImpl& t, bool before) = 0;
};
void add_tensor_access_observer(TensorAccessObserver* observer);
void remove_tensor_access_observer(TensorAccessObserver* observer);
// Tells the observers, if any, that `t`'s memory is used (cheap when there are none).
void notify_tensor_access(const Tensor& t, bool before);

class Node {
 public:
  using BackwardFn = std::function<void(const Tensor& grad_output, GradSink& sink)>;

  Node(std::string name, const std::vector<Tensor>& inputs, BackwardFn backward);
  // Frees the chain of nodes behind it without recursing (see autograd.cpp).
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& name() const { return name_; }
  std::uint64_t sequence_nr() const { return sequence_nr_; }

 private:
  friend class BackwardPass;
  friend std::unordered_set<const TensorImpl*> reachable_leaves(std::span<const Tensor> roots);
  // Input i's origin: the node that produced it, or the leaf itself, or nothing (no grad).
  struct Edge {
    std::shared_ptr<Node> node;
    std::shared_ptr<TensorImpl> leaf;
    Shape shape;
    Device device;
    bool needs_grad() const { return node != nullptr || leaf != nullptr; }
  };
  std::string name_;
  std::uint64_t sequence_nr_;
  std::vector<Edge> edges_;
  BackwardFn backward_;
};

// A tensor a backward function needs, with its version() at the moment it was saved
// (PyTorch's SavedVariable). Ops capture their inputs (and outputs) this way, not as plain
// handles: a handle is not a value, and a write into the tensor between the forward and the
// backward (a refilled input buffer, a weight clipped under NoGrad, an optimizer step) would
// otherwise be read by the backward function, which then computes a wrong gradient without a
// word. unpack() refuses it instead, naming the op.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& tensor)
      : tensor_(tensor.defined() ? tensor.detach() : Tensor()),
        version_(tensor.defined() ? tensor.version() : 0),
        name_(tensor.defined() ? tensor.name() : std::string()) {}
  // The saved tensor (no autograd history); an Error if it was written in place since.
  Tensor unpack() const;

 private:
  Tensor tensor_;
  std::uint64_t version_ = 0;
  std::string name_;  // a parameter's, for the message
};

// `tensor` saved only if `wanted` will get a gradient from this op (mul saves b for a's
// gradient): PyTorch saves no more, so a tensor no gradient reads may be written before
// backward. Empty otherwise (unpack() gives an undefined tensor).
inline SavedTensor save_for_grad_of(const Tensor& wanted, const Tensor& tensor) {
  return NoGrad::grad_enabled() && wanted.defined() && wanted.requires_grad() ? SavedTensor(tensor)
                                                                              : SavedTensor();
}

// Records `output` as produced by `name` from `inputs` with the given backward function, when
// grad mode is on and some input requires a gradient. Returns `output` for chaining:
//   return record("relu", y, {x}, [x](const Tensor& g, GradSink& sink) { ... });
Tensor record(std::string name, Tensor output, const std::vector<Tensor>& inputs,
              Node::BackwardFn backward);

// Runs backward from `root` (a one-element tensor), seeding d root / d root = 1.
void run_backward(const Tensor& root);

// Queues `callback` to run once the backward pass in progress on this thread has finished
// (after every node and hook). Only valid from inside a backward pass (a hook or a backward
// function). The DDP Reducer queues its finalize step this way, so `loss.backward()` returns
// only once every bucket has been reduced, as with PyTorch's DDP. If the pass ends with an
// exception instead, `on_abort` (when given) runs before the exception leaves backward(): the
// Reducer uses it to wait for the collectives it already launched, which still write into the
// gradient buffers the next pass is about to use. A callback that throws ends the pass the same
// way: the callbacks queued after it do not run, and get their `on_abort`.
void queue_backward_callback(std::function<void()> callback, std::function<void()> on_abort = {});

// A number that identifies the backward pass running on this thread (0 outside a pass): lets a
// hook tell a new pass from the rest of the current one, even after a pass died mid-way.
std::uint64_t current_backward_pass();

// How many nodes of the pass running on this thread have run their backward function so far.
// Gradients that become final with the same count were finished by the same node: the DDP
// Reducer records it per parameter to learn the order backward really produces gradients in.
std::uint64_t backward_nodes_run();

}  // namespace nanoddp
