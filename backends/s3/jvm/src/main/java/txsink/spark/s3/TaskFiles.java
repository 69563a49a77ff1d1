package txsink.spark.s3;

import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;

import org.apache.hadoop.fs.s3a.commit.files.SinglePendingCommit;
import org.apache.hadoop.fs.s3a.commit.files.UploadEtag;

/**
 * What one committed task attempt left pending: its one file's upload, or nothing (a
 * task without rows writes no file), and the rows Spark counted into it.
 *
 * <p>It travels to the driver as the task's commit message. {@link #rows} is -1 until the
 * task's completion listener sets it; the driver refuses a job with a task whose rows
 * are unknown.
 */
final class TaskFiles implements Serializable {
    private static final long serialVersionUID = 1L;

    final int partition;
    final long attempt;
    /** Keys Spark opened a file for, in this attempt (newTaskTempFile). */
    final List<String> opened = new ArrayList<>();
    /** The uploads S3A left pending for them: key, upload id, size, part ETags. */
    final List<Upload> uploads = new ArrayList<>();
    volatile long rows = -1;

    TaskFiles(int partition, long attempt) {
        this.partition = partition;
        this.attempt = attempt;
    }

    static final class Upload implements Serializable {
        private static final long serialVersionUID = 1L;
        final String bucket;
        final String key;
        final String uploadId;
        final long size;
        final List<String> etags;

        Upload(String bucket, String key, String uploadId, long size, List<String> etags) {
            this.bucket = bucket;
            this.key = key;
            this.uploadId = uploadId;
            this.size = size;
            this.etags = etags;
        }
    }

    /** Take the task's pending uploads; refuse anything but one upload per opened file. */
    void collect(List<SinglePendingCommit> commits) throws IOException {
        if (commits.size() != opened.size()) {
            throw new IOException("txsink: task " + partition + " attempt " + attempt
                + " opened " + opened.size() + " file(s) but S3A reports " + commits.size()
                + " pending upload(s) for it: is the magic committer enabled for this"
                + " bucket (fs.s3a.committer.magic.enabled)?");
        }
        for (SinglePendingCommit c : commits) {
            if (!opened.contains(c.getDestinationKey())) {
                throw new IOException("txsink: S3A reports a pending upload to "
                    + c.getDestinationKey() + ", not a file this task opened " + opened);
            }
            if (MagicTaskCommitter.hasChecksums(c)) {
                throw new IOException("txsink: the upload of " + c.getDestinationKey()
                    + " carries part checksums (fs.s3a.create.checksum.algorithm), which"
                    + " txsink's commit does not send: unset that option for this bucket");
            }
            List<String> etags = new ArrayList<>();
            for (UploadEtag e : c.getEtags()) {
                etags.add(e.getEtag());
            }
            uploads.add(new Upload(c.getBucket(), c.getDestinationKey(), c.getUploadId(),
                c.getLength(), etags));
        }
    }
}
