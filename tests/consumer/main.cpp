// Trains nn.Linear(5, 3) with MSE for a few SGD steps through the installed nanoddp and checks
// that the loss went down: proof that the installed headers, library and package config work.
// One include is enough for a normal program: the umbrella header names every public header.
#include <nanoddp/nanoddp.h>

#include <cstdio>

int main() {
  using namespace nanoddp;
  nn::Mlp model(nn::MlpOptions{.in_features = 5, .out_features = 3, .layers = 0, .seed = 1});
  nn::FlatParameters params(model, Device::cpu());
  nn::SGD sgd(params, nn::SgdOptions{.lr = 0.1f});
  Tensor x = Tensor::normal({16, 5}, 0.0f, 1.0f, {.seed = 7});
  Tensor y = Tensor::normal({16, 3}, 0.0f, 1.0f, {.seed = 8});
  float first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    sgd.zero_grad();
    Tensor loss = mse_loss(model(x), y);
    loss.backward();
    sgd.step();
    (step == 0 ? first : last) = loss.item();
  }
  std::printf("consumer: loss %.6f -> %.6f\n", first, last);
  return last < first ? 0 : 1;
}
