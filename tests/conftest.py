import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


import pytest  # noqa: E402
import os  # noqa: E402

os.environ.setdefault("LOKY_MAX_CPU_COUNT", "1")  # scikit-learn's k-means would count cores in a subprocess
if "MTLAB_CACHE" not in os.environ:  # parsed lists, header lengths, statistics: not in the user's own cache
    import tempfile

    os.environ["MTLAB_CACHE"] = tempfile.mkdtemp(prefix="mtlab-test-cache-")
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests: derandomized in CI, so a failure CI finds reproduces with the same command, with a bounded
# number of examples (tests scale their budget from ``settings.default.max_examples``) and shrink time.
# ``HYPOTHESIS_PROFILE=long python -m pytest tests/test_properties.py`` searches at random, 40x longer.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=25, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", derandomize=False, deadline=None, max_examples=1000, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)
if PROFILE == "ci":
    # Hypothesis has no setting for the shrink phase's length (its engine allows 300 s); a derandomized
    # failure reproduces exactly, so CI shrinks for at most 30 s and the long profile shrinks fully.
    from hypothesis.internal.conjecture import engine as _engine

    if hasattr(_engine, "MAX_SHRINKING_SECONDS"):
        _engine.MAX_SHRINKING_SECONDS = 30


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: starts a subprocess, kernel, browser, wheel build or survey "
                            "(the fast tier is `pytest -m 'not slow'`)")


@pytest.fixture
def one_thread():
    """Tiny models: one torch thread is fastest and avoids oversubscribing shared CI cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------ the fast tier
# `pytest -m "not slow"` is the quick check (under a minute on 2 cores). Whole modules that start kernels,
# browsers, process groups or wheel builds are slow here; single tests elsewhere carry @pytest.mark.slow.
SLOW_MODULES = {
    "browser/test_jupyterlab.py", "test_notebooks.py", "ui/test_kernel.py", "ui/test_notebook_outputs.py",
    "test_wheel.py", "test_distributed.py", "test_distributed_agree.py", "test_distributed_elastic.py",
}
# Single tests that take over about a second on a quiet 2-core machine (train a recipe end to end, load the
# corpus, read loggers back), by file and function name (every parameter).
SLOW_TESTS = {
    "ui/test_plot_layout.py::test_live_plot_has_no_overlapping_text_running_and_zoomed",
    "ui/test_plot_layout.py::test_a_non_negative_loss_axis_is_not_padded_below_zero",
    "ui/test_plots.py::test_pngs_are_sized_to_the_displayed_width",
    "ui/test_plots.py::test_log_linear_toggle_and_smoothing",
    "ui/test_plots.py::test_zoom_and_read_out_every_series_at_a_step",
    "ui/test_runs.py::test_only_the_newest_dashboard_of_a_trainer_stays_attached",
    "data/test_data_features.py::test_stats_normalize_and_round_trip",
    "test_precision.py::test_the_precision_flag_is_written_into_the_recipe_the_checkpoint_carries",
    "test_loop_stopping.py::test_the_summary_explains_an_early_stop_in_plain_words",
    "ui/test_plots.py::test_validation_points_from_the_loop_and_from_evaluate",
    "test_separation.py::test_remixed_set_is_deterministic_and_shaped_like_the_corpus",
    "test_separation.py::test_audio_players_and_settings_errors",
    "test_sync_free.py::test_a_step_with_the_recipes_models_reads_nothing_back",
    "ui/test_plot_layout.py::test_history_figure_has_no_overlapping_text",
    "data/test_fromlhotse.py::test_a_recipe_trains_on_the_lists",
    "data/test_dynamic.py::test_resume_mid_epoch_is_bit_exact",
    "data/test_data_features.py::test_sine_window_is_scipys_cosine_and_others_match_numpy",
    "data/test_data_features.py::test_magnitude_matches_direct_stft",
    "data/test_data_corpus.py::test_example_keys_shapes_and_dtypes",
    "data/test_data_corpus.py::test_linked_sets_share_names_and_source_targets",
    "data/test_data_corpus.py::test_stats_come_from_train_only",
    "data/test_data_corpus.py::test_targets_consistent_with_sources",
    "data/test_layouts.py::test_a_recipe_trains_from_each_layout",
    "data/test_layouts.py::test_prepared_lists_load_as_the_sample_corpus",
    "test_cli.py::test_demo_runs_a_few_steps",
    "test_cli.py::test_train_resume_evaluate",
    "test_combine.py::test_a_recipe_chooses_the_method",
    "test_combine.py::test_two_ranks_equal_one_process",
    "test_interrupts.py::test_ctrl_c_inside_a_run",
    "test_loggers.py::test_cli_log_option_writes_train_and_validation_scalars",
    "test_loggers.py::test_logged_loss_and_step_axis_do_not_change_with_accumulation",
    "test_loggers.py::test_mlflow_store_reads_back",
    "test_loggers.py::test_recipe_log_key_chooses_the_loggers_and_names_a_bad_one",
    "test_loggers.py::test_rows_cut_by_a_restore_are_not_logged",
    "test_loggers.py::test_tensorboard_validation_and_buffering",
    "test_loggers.py::test_trackio_local_store_reads_back",
    "test_loop.py::test_ctrl_c_finishes_the_step_saves_and_resumes_exactly",
    "test_loop.py::test_n_steps_save_load_n_steps_equals_2n_steps",
    "test_loop.py::test_nan_minibatch_is_skipped_under_nonfinite_skip",
    "test_loop_stages.py::test_recipe_init_file_loads_the_weights",
    "test_loop_stages.py::test_recipe_stages_resume_exactly",
    "test_loop_stopping.py::test_a_checkpoint_between_go_back_and_the_next_step_continues_the_same",
    "test_loop_stopping.py::test_a_stop_restores_the_best_model_which_is_final",
    "test_metrics.py::test_bss_sdr_matches_mir_eval",
    "test_metrics.py::test_bss_sdr_returns_in_a_fresh_process",
    "test_metrics.py::test_cli_score_writes_the_tables_of_evaluate_lists",
    "test_metrics.py::test_evaluate_lists_reads_kaldi_lists",
    "test_metrics.py::test_evaluate_table_rows_summary_and_files",
    "test_metrics.py::test_score_uses_the_permutation_for_every_metric_and_the_mixture_baseline",
    "test_nabu_cli.py::test_train_an_original_recipe_folder_with_a_data_root",
    "test_nabu_import.py::test_an_imported_recipe_builds_and_trains_a_step",
    "test_nabu_import.py::test_every_original_recipe_reads_leniently",
    "test_properties.py::TestStepwiseCalls::runTest",
    "test_recipe.py::test_checkpoint_killed_mid_write_leaves_the_old_one",
    "test_recipe.py::test_resume_names_the_rule_that_stopped_the_run",
    "test_reliability.py::test_a_data_file_deleted_mid_run",
    "test_reliability.py::test_an_exception_inside_a_call_leaves_the_state_before_it",
    "test_reliability.py::test_damaged_checkpoints_give_a_clear_error_and_run_nothing",
    "test_reliability.py::test_disk_full_while_saving_keeps_the_old_checkpoint",
    "test_reliability.py::test_nonfinite_values_never_reach_the_parameters_under_skip",
    "test_sampling.py::test_stream_with_dataloader_workers_matches_in_process",
    "test_separation.py::test_import_separation_pulls_in_no_ui_library",
    "test_separation.py::test_runner_trains_evaluates_and_separates",
    "test_separation_losses.py::test_registry_imports_the_separation_package_on_a_miss",
    "test_trainer.py::test_import_mtlab_pulls_in_no_ui_library",
    "test_weighting.py::test_random_loss_weights_are_seeded_by_the_step_and_resume_exactly",
    "ui/test_dashboard.py::test_plot_helpers_return_figures_and_write_pngs",
    "ui/test_dashboard.py::test_snapshot_and_restore",
    "ui/test_dashboard.py::test_validation_points_from_evaluate_events",
    "ui/test_plots.py::test_changes_are_marked_and_logged",
    "ui/test_plots.py::test_pngs_are_high_dpi",
    "ui/test_plots.py::test_the_live_plot_follows_a_run",
    "ui/test_runs.py::test_a_dashboard_run_uses_the_loop_with_lr_decay_and_validation",
    "ui/test_runs.py::test_a_run_goes_through_the_training_loop",
    "ui/test_runs.py::test_choose_the_snapshot_and_keep_the_abandoned_branch_grey",
    "ui/test_runs.py::test_exports_write_png_svg_and_csv",
    "ui/test_runs.py::test_inline_painter_draws_between_steps_in_the_run_thread",
    "ui/test_runs.py::test_only_the_newest_dashboard_of_a_run_draws",
}
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if not path.is_relative_to(TESTS):
            continue
        rel = path.relative_to(TESTS).as_posix()
        name = item.nodeid.split("::", 1)[1].split("[", 1)[0]
        if rel in SLOW_MODULES or f"{rel}::{name}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test outside the slow tier may not start a subprocess: it would make the quick check slow. Mark it
    ``@pytest.mark.slow`` instead."""
    if request.node.get_closest_marker("slow") is not None:
        return
    import subprocess

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a subprocess; mark it @pytest.mark.slow")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
