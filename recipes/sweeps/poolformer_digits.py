"""PoolFormer-tiny on digits: optimiser settings and the token mixer, one objective (val/acc1), pruned.

    zoo sweep recipes/sweeps/poolformer_digits.py --n-trials 20

Each trial trains the demo recipe for 5 epochs; the median pruner stops a trial whose val/acc1 falls
below the median of earlier trials at the same epoch (from epoch 2 on).
"""
BASE = 'recipes/configs/poolformer/poolformer_tiny_digits_15e.yaml'
METRIC = 'val/acc1'
DIRECTIONS = ('maximize',)
N_TRIALS = 20
ARGS = ['--trainer.max_epochs=5']


def space(trial) -> dict:
    return {
        'model.init_args.optimizer.init_args.lr': trial.suggest_float('lr', 3e-4, 1e-2, log=True),
        'model.init_args.optimizer.init_args.weight_decay': trial.suggest_float('weight_decay', 1e-3, 0.1, log=True),
        'model.init_args.label_smoothing': trial.suggest_float('label_smoothing', 0.0, 0.2),
        'model.init_args.model_args': {'token_mixer': trial.suggest_categorical(
            'token_mixer', ['pooling', 'sepconv', 'attention', 'identity'])},
    }


def pruner():
    import optuna
    return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=2)
