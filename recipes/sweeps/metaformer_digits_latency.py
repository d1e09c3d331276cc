"""MetaFormer-tiny on digits: which token mixer in which stage, accuracy against CPU latency.

    zoo sweep recipes/sweeps/metaformer_digits_latency.py --n-trials 30

Two objectives, val/acc1 (maximise) and the trained model's batch-1 CPU latency in ms (minimise).
Optuna cannot prune multi-objective studies, so every trial trains its full 4 epochs; the sampler is
chosen explicitly (multivariate TPE, seeded) so results do not move with Optuna's default.
``study.best_trials`` is the Pareto front; ``zoo results --plot`` draws it from the run rows.
"""
BASE = 'recipes/configs/poolformer/poolformer_tiny_digits_15e.yaml'
METRIC = 'val/acc1'
DIRECTIONS = ('maximize', 'minimize')      # (accuracy, latency_ms)
N_TRIALS = 30
SEED = 0
ARGS = ['--model.init_args.name=metaformer_tiny', '--trainer.max_epochs=4']
MIXERS = ['pooling', 'sepconv', 'attention', 'identity']


def space(trial) -> dict:
    mixers = [trial.suggest_categorical(f'mixer_stage{i}', MIXERS) for i in range(4)]
    return {'model.init_args.model_args': {'token_mixer': mixers},
            'model.init_args.optimizer.init_args.lr': trial.suggest_float('lr', 1e-3, 8e-3, log=True)}


def sampler(seed):
    import optuna
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
